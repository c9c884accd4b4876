"""A throwaway `redis-server` on a free port of 127.0.0.1 (no persistence), stopped by
PID; tests that need one are skipped, with a message, where redis-server is absent."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_redis() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/bootstrap-test.sh installs it)")
    pytest.importorskip("redis", reason="the redis package is missing (pip install redis)")
    return binary


@contextmanager
def redis_server() -> Iterator[str]:
    """Yields the server's URL, redis://127.0.0.1:PORT."""
    binary = require_redis()
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_ready(port, proc)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")
