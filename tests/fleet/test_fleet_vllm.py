"""The fleet in front of a real vLLM CPU server (the `vllm_peer` install), next to an
andante toy server: models of both, vLLM's /metrics read, SLOs forwarded, streams."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fleet.helpers import fleet_server, toy_upstreams
from tests.peers import VllmPeer

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 400


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def vllm_server(peer: VllmPeer, log: Path) -> Iterator[str]:
    port = _free_port()
    cmd = [str(peer.python), "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(peer.model), "--served-model-name", "smollm2", "--dtype", "bfloat16",
           "--max-model-len", "2048", "--max-num-seqs", "8", "--enforce-eager",
           "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"vLLM exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "vLLM did not start in time"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_fleet_in_front_of_vllm_and_andante(vllm_peer: VllmPeer, tmp_path: Path) -> None:
    with vllm_server(vllm_peer, tmp_path / "vllm.log") as vllm, toy_upstreams(1) as toys, \
            fleet_server([vllm, toys[0].url]) as fleet:
        models = {m["id"] for m in httpx.get(f"{fleet.url}/v1/models").json()["data"]}
        assert models == {"smollm2", "toy"}
        upstream = fleet.fleet.upstreams[0]
        assert upstream.kind == "vllm"
        assert upstream.polled.kv_usage is not None  # vLLM's gauges were read
        body = {"model": "smollm2", "max_tokens": 8, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "stream_options": {"include_usage": True},
                "slo": {"ttft": 5.0, "tbt": 0.5, "deadline": 60.0}}
        raw = b""
        with httpx.stream("POST", f"{fleet.url}/v1/chat/completions", json=body,
                          timeout=120) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                raw += chunk
        events = [e[6:] for e in raw.decode().split("\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        assert usage["completion_tokens"] == 8
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                       for e in events[:-1] if json.loads(e)["choices"])
        assert "Paris" in text
        # the same SLO as vLLM's flat keys, not streamed
        flat = {**body, "stream": False, "slo": None,
                "vllm_xargs": {"ttft": 5.0, "deadline": 60.0}}
        del flat["slo"], flat["stream_options"]
        r = httpx.post(f"{fleet.url}/v1/chat/completions", json=flat, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
