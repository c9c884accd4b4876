"""Run a server: in the foreground (`andante serve`) or in a background thread
(tests, benchmarks, notebooks) on an already bound socket, so port 0 just works.

The port is bound before the model loads, so a busy port fails at once. When every
engine instance is down the open streams end with an error and the server stops with
exit status 1, for a supervisor to restart it (one instance down of several: the
others serve on; see `runner.ClusterRunner`).
"""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

from andante.runtime.gc_heap import freeze_heap
from andante.server.app import create_app
from andante.server.backend import Backend
from andante.server.config import ServeOptions
from andante.server.listen import PortUnavailable as PortUnavailable  # re-exported
from andante.server.listen import bind
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


class ServerThread:
    """A live server on 127.0.0.1 in a background thread; a context manager.

    `url` is its base URL; `state` the server's `ServerState` (engine, hub, metrics);
    `exit_status` what `serve` would return once the thread has ended.
    """

    def __init__(self, options: ServeOptions, backend: Backend | None = None) -> None:
        self._sock = bind(options.host, options.port)
        self.host, self.port = self._sock.getsockname()[:2]
        self._app = create_app(options, backend)
        self.state: ServerState = self._app.state.andante
        self._server = _uvicorn_server(self._app, options)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="andante-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    @property
    def exit_status(self) -> int:
        return _exit_status(self._app)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
