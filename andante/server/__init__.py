"""OpenAI-compatible HTTP server: SSE streaming, per-request SLOs, Prometheus metrics,
a live page, over the cluster controller and its instances (one by default).

`create_app(ServeOptions(...))` builds an app; `serve(options)` runs it;
`ServerThread(options)` runs one in the background (tests, benchmarks).
"""

from andante.server.app import create_app
from andante.server.backend import Backend, build_backend
from andante.server.config import TOY_MODEL, EngineOptions, ServeOptions
from andante.server.launch import ServerThread, serve

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
