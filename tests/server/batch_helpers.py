"""Batch API test helpers: input files, server processes that can be killed (-9), polls."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx


def batch_lines(n: int, url: str = "/v1/completions", max_tokens: int = 4,
                prefix: str = "req") -> list[dict[str, Any]]:
    body: dict[str, Any] = ({"prompt": "Hello", "max_tokens": max_tokens}
                            if url == "/v1/completions" else
                            {"messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": max_tokens})
    return [{"custom_id": f"{prefix}-{i}", "method": "POST", "url": url,
             "body": json.loads(json.dumps(body))} for i in range(n)]


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


class ServeProcess:
    """`andante serve --model toy --port 0 ARGS` in a subprocess, stopped by PID."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "andante.cli.main", "serve", "--model", "toy", "--port",
             "0", "--log-level", "warning", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if match is None:
            self.kill()
            raise AssertionError(f"the server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{match.group(1)}"

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def serve_process(*args: str) -> Iterator[ServeProcess]:
    server = ServeProcess(*args)
    try:
        yield server
    finally:
        server.stop()


def upload(url: str, content: bytes, purpose: str = "batch") -> httpx.Response:
    return httpx.post(f"{url}/v1/files", files={"file": ("in.jsonl", content)},
                      data={"purpose": purpose}, timeout=30)


def submit(url: str, lines: list[dict[str, Any]], endpoint: str = "/v1/completions",
           window: str = "24h") -> dict[str, Any]:
    uploaded = upload(url, jsonl(lines))
    assert uploaded.status_code == 200, uploaded.text
    created = httpx.post(f"{url}/v1/batches", json={
        "input_file_id": uploaded.json()["id"], "endpoint": endpoint,
        "completion_window": window}, timeout=30)
    assert created.status_code == 200, created.text
    return dict(created.json())


def get_batch(url: str, batch_id: str) -> dict[str, Any]:
    reply = httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def wait_batch(url: str, batch_id: str, until: Any, timeout: float = 60.0) -> dict[str, Any]:
    """Poll the batch until `until(batch)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        batch = get_batch(url, batch_id)
        if until(batch):
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch not there in {timeout} s: {batch}")
        time.sleep(0.05)


def finished(batch: dict[str, Any]) -> bool:
    return batch["status"] in ("completed", "failed", "expired", "cancelled")


def output_lines(url: str, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    reply = httpx.get(f"{url}/v1/files/{file_id}/content", timeout=30)
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines()]
