"""`andante serve --instances N --backend ... --router ...` and `simulate --router`."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest

from andante.cli.main import build_parser
from andante.cli.serve import options_from_args
from andante.cli.simulate import cluster_from_args


def test_cluster_options_from_the_command_line() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "toy", "--instances", "3", "--backend", "ray", "--router",
         "ascendra", "--hp-instances", "1", "--ray-address", "auto", "--max-restarts", "5",
         "--router-option", "capacity=64"])
    options = options_from_args(args)
    assert (options.instances, options.backend, options.router) == (3, "ray", "ascendra")
    assert (options.ray_address, options.max_restarts) == ("auto", 5)
    assert dict(options.router_options) == {"capacity": 64}
    with pytest.raises(ValueError, match="backend"):
        type(options)(backend="grpc")


def test_simulate_builds_ascendra_pools() -> None:
    args = build_parser().parse_args(["simulate", "--instances", "3", "--router", "ascendra"])
    spec = cluster_from_args(args, "vllm")
    assert [i.role for i in spec.instances] == ["lp", "lp", "hp"]
    assert spec.router == "ascendra" and spec.num_instances == 3


def test_serve_process_fronts_three_instances() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "andante.cli.main", "serve", "--model", "toy", "--port", "0",
         "--log-level", "warning", "--toy-step-ms", "1", "--instances", "3", "--router",
         "least-loaded"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        url = f"http://127.0.0.1:{match.group(1)}"
        for _ in range(3):
            r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3},
                           timeout=30)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "The"
        stats = httpx.get(url + "/api/stats", timeout=30).json()["cluster"]
        assert stats["router"] == "least-loaded" and len(stats["instances"]) == 3
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
