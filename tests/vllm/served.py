"""Serve the vLLM CPU peer in a subprocess for tests: with andante's scheduler class or
vLLM's own, on a free port, stopped (with its engine process) by its process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from andante.server.http_timing import LOG_ENV as HTTP_LOG_ENV
from tests.peers import REPO, VllmPeer

MODEL = "smollm2"
HTTP_TIMING = "andante.server.http_timing.HttpTiming"
#: small limits so a few requests fill the KV cache (12 blocks of 128 tokens)
LIMITS = ["--max-model-len", "1024", "--max-num-batched-tokens", "1024",
          "--max-num-seqs", "16", "--num-gpu-blocks-override", "12"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, name: str) -> float:
        """The sum of a /metrics sample's values (all label sets)."""
        body = httpx.get(f"{self.url}/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))


def command(peer: VllmPeer, port: int, andante: dict[str, Any] | None,
            extra: list[str]) -> list[str]:
    cmd = [str(peer.python), "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(peer.model), "--served-model-name", MODEL, "--dtype", "bfloat16",
           "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
           "--no-async-scheduling", *LIMITS, *extra]
    if andante is not None:
        cmd += ["--scheduler-cls", "andante.vllm.Scheduler",
                "--additional-config", json.dumps({"andante": andante})]
    return cmd


def start(peer: VllmPeer, log: Path, andante: dict[str, Any] | None = None,
          extra: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start the server (returns at once; `wait_ready` waits for /health). With a
    `step_log`, vLLM's API server also times each streamed response at its HTTP edge
    into the same file (andante.server.http_timing)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    if andante is not None and andante.get("step_log"):
        env[HTTP_LOG_ENV] = str(andante["step_log"])
        extra = [*(extra or []), "--middleware", HTTP_TIMING]
    with log.open("wb") as out:
        proc = subprocess.Popen(command(peer, port, andante, extra or []), stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    proc.port = port  # type: ignore[attr-defined]
    return proc


def wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 400) -> Served:
    url = f"http://127.0.0.1:{proc.port}"  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return Served(proc, url, log)
        time.sleep(1)
    stop(proc)
    raise RuntimeError(f"vLLM not healthy in {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the server and its engine process (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def stream(url: str, prompt: str, max_tokens: int) -> int:
    """A streamed completion (ignore_eos), read to its end; the number of events."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as reply:
        assert reply.status_code == 200, reply.read()
        return sum(1 for line in reply.iter_lines() if line.startswith("data: {"))


def complete(url: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **extra}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result
