"""Run a server: in the foreground (`andante serve`) or in a background thread
(tests, benchmarks, notebooks) on an already bound socket, so port 0 just works.

The port is bound before the model loads, so a busy port fails at once. When every
engine instance is down the open streams end with an error and the server stops with
exit status 1, for a supervisor to restart it (one instance down of several: the
others serve on; see `runner.ClusterRunner`).
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from andante.runtime.gc_heap import freeze_heap
from andante.server.app import create_app
from andante.server.backend import Backend
from andante.server.config import ServeOptions
from andante.server.listen import PortUnavailable as PortUnavailable  # re-exported
from andante.server.listen import ThreadedServer, bind
from andante.server.listen import log_to_stderr as _log_to_stderr
from andante.server.state import ServerState
from andante.server.timeouts import h11_protocol

EXIT_ENGINE_DOWN = 1


def _uvicorn_server(app: FastAPI, options: ServeOptions) -> uvicorn.Server:
    """The uvicorn server of `app`; it stops when every engine instance is down."""
    config = uvicorn.Config(
        app, log_level=options.log_level, timeout_graceful_shutdown=5, access_log=False,
        timeout_keep_alive=30, lifespan="on", http=h11_protocol(options.limits),
    )
    server = uvicorn.Server(config)
    state: ServerState = app.state.andante

    def on_fatal() -> None:
        server.should_exit = True

    state.on_fatal = on_fatal
    return server


def _exit_status(app: FastAPI) -> int:
    state: ServerState = app.state.andante
    return EXIT_ENGINE_DOWN if state.runner.error is not None else 0


def serve(options: ServeOptions, backend: Backend | None = None) -> int:
    """Serve until interrupted (Ctrl-C / SIGTERM): 0, or 1 once every engine is down.
    Raises `PortUnavailable` before loading anything when the port is taken."""
    _log_to_stderr(options.log_level)
    sock = bind(options.host, options.port)
    app = create_app(options, backend)
    host, port = sock.getsockname()[:2]
    state: ServerState = app.state.andante
    print(f"andante: serving {', '.join(state.backend.served)} on http://{host}:{port} "
          f"(policy {options.policy}; live page at /, metrics at /metrics)", flush=True)
    freeze_heap()  # start-up objects: never walked again (andante.runtime.gc_heap)
    _uvicorn_server(app, options).run(sockets=[sock])
    return _exit_status(app)


class ServerThread(ThreadedServer):
    """A live server on 127.0.0.1 in a background thread; a context manager.

    `url` is its base URL; `state` the server's `ServerState` (engine, hub, metrics);
    `exit_status` what `serve` would return once the thread has ended.
    """

    def __init__(self, options: ServeOptions, backend: Backend | None = None) -> None:
        sock = bind(options.host, options.port)
        self._app = create_app(options, backend)
        self.state: ServerState = self._app.state.andante
        super().__init__(sock, _uvicorn_server(self._app, options), "andante-uvicorn")

    @property
    def exit_status(self) -> int:
        return _exit_status(self._app)
