"""`andante serve --instances N --backend ... --router ...` and `simulate --router`."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from andante.cli.main import build_parser
from andante.cli.serve import options_from_args
from andante.cli.simulate import cluster_from_args
from tests.server.helpers import toy_serve_process


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


def test_simulate_reads_a_cluster_file_and_qlm_options(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text('models = ["mistral-7b", "vicuna-13b"]\n[[instances]]\n'
                    'hardware = "a10-24g"\nmodel = "mistral-7b"\n[[instances]]\n'
                    'model = "vicuna-13b"\n')
    args = build_parser().parse_args(
        ["simulate", "--cluster", str(path), "--router", "qlm", "--router-option",
         "delta=2", "--model-mix", "mistral-7b:3,vicuna-13b:1"])
    spec = cluster_from_args(args, "edf")
    assert spec.num_instances == 2 and spec.models == ("mistral-7b", "vicuna-13b")
    assert (spec.router, spec.router_options, spec.auto_preemption) == ("qlm", {"delta": 2},
                                                                        True)
    assert [spec.instance_spec(i).hardware for i in range(2)] == ["a10-24g", "a100-80g"]
    bad = build_parser().parse_args(["simulate", "--cluster", str(tmp_path / "none.toml")])
    with pytest.raises(ValueError, match="cannot read cluster file"):
        cluster_from_args(bad, "vllm")


def test_serve_process_fronts_three_instances() -> None:
    with toy_serve_process("--instances", "3", "--router", "least-loaded") as url:
        for _ in range(3):
            r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3},
                           timeout=30)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "The"
        stats = httpx.get(url + "/api/stats", timeout=30).json()["cluster"]
        assert stats["router"] == "least-loaded" and len(stats["instances"]) == 3
