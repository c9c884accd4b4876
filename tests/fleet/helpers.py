"""Real upstream processes and a scriptable fake upstream for the fleet tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from andante.runtime.upstream.discovery import UpstreamSpec
from andante.runtime.upstream.fleet import FleetOptions
from andante.server.fleet_app import FleetServeOptions
from andante.server.fleet_launch import FleetServerThread
from andante.server.launch import bind

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


@dataclass
class Upstream:
    url: str
    proc: subprocess.Popen[str]

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL, by PID
        self.proc.wait(timeout=10)


def start_toy(step_ms: float = 2.0, *args: str) -> Upstream:
    """`andante serve --model toy` on a free port, as a separate process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "andante.cli.main", "serve", "--model", "toy", "--port", "0",
         "--log-level", "warning", "--toy-step-ms", str(step_ms),
         "--state-dir", tempfile.mkdtemp(prefix="andante-upstream-"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()
        raise AssertionError(f"toy upstream did not start: {line!r}")
    return Upstream(f"http://127.0.0.1:{match.group(1)}", proc)


@contextmanager
def toy_upstreams(count: int, step_ms: float = 2.0, *args: str) -> Iterator[list[Upstream]]:
    ups: list[Upstream] = []
    try:
        for _ in range(count):
            ups.append(start_toy(step_ms, *args))
        yield ups
    finally:
        for up in ups:
            if up.proc.poll() is None:
                up.proc.terminate()
                try:
                    up.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    up.kill()


def fleet_options(urls: list[str], roles: list[str] | None = None, max_num_seqs: int = 64,
                  **fleet: Any) -> FleetServeOptions:
    fleet.setdefault("poll_interval", 0.1)
    fleet.setdefault("probe_timeout", 2.0)  # a busy test machine answers slowly
    roles = roles or [""] * len(urls)
    specs = tuple(UpstreamSpec(u, role=r, max_num_seqs=max_num_seqs)
                  for u, r in zip(urls, roles, strict=True))
    return FleetServeOptions(specs, FleetOptions(**fleet), port=0, log_level="warning")


@contextmanager
def fleet_server(urls: list[str], **kwargs: Any) -> Iterator[FleetServerThread]:
    with FleetServerThread(fleet_options(urls, **kwargs)) as server:
        yield server


@dataclass
class FakeUpstream:
    """A scriptable OpenAI-compatible server: its /v1/models entries, the statuses its
    next completions answer (then 200), the bodies it received; `empty_streams`: a
    streamed request gets a 200 with an empty body."""

    models: list[dict[str, Any]] = field(default_factory=lambda: [
        {"id": "fake", "object": "model", "owned_by": "vllm", "root": "/models/fake"}])
    statuses: list[int] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    empty_streams: bool = False
    raw_bodies: list[bytes] = field(default_factory=list)
    metrics: str = ("vllm:num_requests_running{model_name=\"fake\"} 0\n"
                    "vllm:num_requests_waiting{model_name=\"fake\"} 0\n"
                    "vllm:kv_cache_usage_perc{model_name=\"fake\"} 0.25\n")

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": self.models}

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(self.metrics, media_type="text/plain")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            self.raw_bodies.append(await request.body())
            body = await request.json()
            self.bodies.append(body)
            status = self.statuses.pop(0) if self.statuses else 200
            if status != 200:
                return JSONResponse({"error": {"message": f"scripted {status}"}}, status)
            if self.empty_streams and body.get("stream"):
                return Response(b"", media_type="text/event-stream")
            return JSONResponse({"object": "text_completion", "model": body.get("model"),
                                 "choices": [{"index": 0, "text": "ok",
                                              "finish_reason": "stop"}]})

        return app


@contextmanager
def fake_upstream(fake: FakeUpstream) -> Iterator[str]:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(fake.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake upstream did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
