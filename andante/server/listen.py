"""The listening socket and andante's log handler, shared by the engine server
(`launch`) and the fleet front (`fleet_launch`); kept apart from both so that the fleet
process never imports the engine (nor torch)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Self


class PortUnavailable(Exception):
    """The server cannot listen on its host and port (the message says why)."""


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without it Nagle's algorithm holds a small
    # reply on a kept-alive connection until the client's delayed ACK (~40 ms)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortUnavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def log_to_stderr(level: str) -> None:
    """andante's own log lines (KV sizing, clients gone, failures) on stderr, in
    uvicorn's format and at its level."""
    logger = logging.getLogger("andante")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())


class ThreadedServer:
    """A uvicorn server on a bound socket, run in a background daemon thread; a context
    manager (the engine server's `ServerThread` and the fleet's `FleetServerThread`)."""

    def __init__(self, sock: socket.socket, server: Any, thread_name: str) -> None:
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name=thread_name, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def start(self, timeout: float = 30.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self._thread.name} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
