"""Routers by name. Adding one = one module plus one line here (imported on demand)."""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

from andante.cluster.router import Router

ROUTERS = MappingProxyType({
    "round-robin": "andante.cluster.router:RoundRobinRouter",
    "least-loaded": "andante.cluster.router:LeastLoadedRouter",
    "power-of-two": "andante.cluster.router:PowerOfTwoRouter",
    "ascendra": "andante.cluster.ascendra:AscendraRouter",
})


def router_names() -> list[str]:
    return sorted(ROUTERS)


def make_router(name: str, options: dict[str, Any] | None = None) -> Router:
    """The router registered as `name` (or a "module:Class" path), with its options."""
    target = ROUTERS.get(name) or (name if ":" in name else None)
    if target is None:
        raise ValueError(f"unknown router {name!r}; choose one of {', '.join(router_names())}")
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    router: Router = cls(**dict(options or {}))
    return router
