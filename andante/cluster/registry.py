"""Routers by name. Adding one = one module plus one line here (imported on demand)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from andante.cluster.router import Router
from andante.core.imports import load_class

ROUTERS = MappingProxyType({
    "round-robin": "andante.cluster.router:RoundRobinRouter",
    "least-loaded": "andante.cluster.router:LeastLoadedRouter",
    "power-of-two": "andante.cluster.router:PowerOfTwoRouter",
    "ascendra": "andante.cluster.ascendra:AscendraRouter",
    "qlm": "andante.cluster.qlm.router:QLMRouter",
    "shepherd": "andante.cluster.shepherd:ShepherdRouter",
    "kunserve": "andante.cluster.kunserve.router:KunServeRouter",
    "llumnix": "andante.cluster.llumnix:LlumnixRouter",
})


def router_names() -> list[str]:
    return sorted(ROUTERS)


def make_router(name: str, options: dict[str, Any] | None = None) -> Router:
    """The router registered as `name` (or a "module:Class" path), with its options."""
    target = ROUTERS.get(name) or (name if ":" in name else None)
    if target is None:
        raise ValueError(f"unknown router {name!r}; choose one of {', '.join(router_names())}")
    router: Router = load_class(target)(**dict(options or {}))
    return router
