"""OpenAI-compatible HTTP server: SSE streaming, per-request SLOs, Prometheus metrics,
a live page, over the cluster controller and its instances (one by default).

`create_app(ServeOptions(...))` builds an app; `serve(options)` runs it;
`ServerThread(options)` runs one in the background (tests, benchmarks).

The names below load on first use (PEP 562), so that importing a submodule (the fleet
front, `andante.server.fleet_launch`) does not pull in the engine and torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from andante.server.app import create_app
    from andante.server.backend import Backend, build_backend
    from andante.server.config import TOY_MODEL, EngineOptions, ServeOptions
    from andante.server.launch import ServerThread, serve

_HOME = {
    "create_app": "andante.server.app",
    "Backend": "andante.server.backend",
    "build_backend": "andante.server.backend",
    "TOY_MODEL": "andante.server.config",
    "EngineOptions": "andante.server.config",
    "ServeOptions": "andante.server.config",
    "ServerThread": "andante.server.launch",
    "serve": "andante.server.launch",
}

__all__ = [
    "TOY_MODEL",
    "Backend",
    "EngineOptions",
    "ServeOptions",
    "ServerThread",
    "build_backend",
    "create_app",
    "serve",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'andante.server' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
