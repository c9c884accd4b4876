"""Live toy servers for the server, client and bench tests."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from andante.server import EngineOptions, ServeOptions, ServerThread
from andante.server.config import HTTPLimits


def toy_options(max_queued: int = 256, api_key: str | None = None, policy: str = "vllm",
                limits: HTTPLimits | None = None, **engine: Any) -> ServeOptions:
    engine.setdefault("toy_step_time", 0.002)
    return ServeOptions(model="toy", port=0, max_queued=max_queued, api_key=api_key,
                        policy=policy, engine=EngineOptions(**engine), log_level="warning",
                        limits=limits or HTTPLimits())


@contextmanager
def toy_server(**kwargs: Any) -> Iterator[ServerThread]:
    server = ServerThread(toy_options(**kwargs)).start()
    try:
        yield server
    finally:
        server.stop()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def _own_state_dir(args: tuple[str, ...]) -> list[str]:
    """A private --state-dir unless ARGS name one: the state directory is locked, so two
    servers (or one left by a failed test) must never share the user's default."""
    if "--state-dir" in args or "--queue" in args:
        return []
    return ["--state-dir", tempfile.mkdtemp(prefix="andante-test-state-")]


@contextmanager
def serve_process(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`andante serve --port 0 ARGS` as a separate process (a private state directory
    unless ARGS name one); yields its URL, read from the first startup line that has it
    (a real model logs its start-up choices first), then stops it by PID and checks that
    it exited cleanly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "andante.cli.main", "serve", "--port", "0",
         "--log-level", "warning", *_own_state_dir(args), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        match = None
        for line in proc.stdout:
            match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if match:
                break
        assert match, "the server printed no URL"
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        proc.terminate()
        # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)


def toy_serve_process(*args: str) -> AbstractContextManager[str]:
    """`serve_process` on the toy model with 1 ms steps."""
    return serve_process("--model", "toy", "--toy-step-ms", "1", *args)


def connect_raw(host: str, port: int, data: bytes) -> socket.socket:
    """A TCP connection to a server under test with `data` already sent on it."""
    sock = socket.create_connection((host, port), timeout=3)
    sock.sendall(data)
    return sock


def closed_while_trickling(sock: socket.socket, seconds: float = 2.0) -> tuple[bytes, bool]:
    """Send a byte every 50 ms while reading: what came back, and whether the server
    closed the connection within `seconds`."""
    reply = b""
    sock.settimeout(0.05)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sock.sendall(b"x")
        except OSError:
            return reply, True  # reset: closed
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return reply, True
        if not chunk:
            return reply, True
        reply += chunk
    return reply, False
