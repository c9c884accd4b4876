"""Run a server: in the foreground (`andante serve`) or in a background thread
(tests, benchmarks, notebooks) on an already bound socket, so port 0 just works."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from andante.server.app import create_app
from andante.server.backend import Backend
from andante.server.config import ServeOptions
from andante.server.state import ServerState


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(app: FastAPI, options: ServeOptions) -> uvicorn.Config:
    return uvicorn.Config(
        app, log_level=options.log_level, timeout_graceful_shutdown=5, access_log=False,
        timeout_keep_alive=30, lifespan="on",
    )


def serve(options: ServeOptions, backend: Backend | None = None) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM)."""
    app = create_app(options, backend)  # loads the model first: bind only once ready
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]
    state: ServerState = app.state.andante
    print(f"andante: serving {state.backend.model_name} on http://{host}:{port} "
          f"(policy {options.policy}; live page at /, metrics at /metrics)", flush=True)
    uvicorn.Server(_uvicorn_config(app, options)).run(sockets=[sock])


class ServerThread:
    """A live server on 127.0.0.1 in a background thread; a context manager.

    `url` is its base URL; `state` the server's `ServerState` (engine, hub, metrics).
    """

    def __init__(self, options: ServeOptions, backend: Backend | None = None) -> None:
        self._sock = bind(options.host, options.port)
        self.host, self.port = self._sock.getsockname()[:2]
        app = create_app(options, backend)
        self.state: ServerState = app.state.andante
        self._server = uvicorn.Server(_uvicorn_config(app, options))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="andante-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
