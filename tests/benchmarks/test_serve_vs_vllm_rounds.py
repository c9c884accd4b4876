"""serve_vs_vllm.py: one server per policy and backend, rounds in turn, medians."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.scripts import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_systems_per_policy_and_backend() -> None:
    serve = load_benchmark("serve_vs_vllm")
    args = serve.parse_args(["--policy", "andes,vllm", "--andante-backend", "process,inprocess"])
    assert serve.andante_systems(args) == [
        ("andes@process", "andes", "process"), ("andes@inprocess", "andes", "inprocess"),
        ("vllm@process", "vllm", "process"), ("vllm@inprocess", "vllm", "inprocess")]
    one = serve.parse_args(["--policy", "andes", "--andante-backend", "process"])
    assert serve.andante_systems(one) == [("andes", "andes", "process")]
    default = serve.parse_args(["--policy", "andes"])
    assert serve.andante_systems(default) == [("andes", "andes", None)]
    assert "--backend" not in serve.andante_command(default, 1, "andes", None)
    cmd = serve.andante_command(default, 1, "andes", "process")
    assert cmd[cmd.index("--backend") + 1] == "process"


def test_medians_over_rounds_per_workload() -> None:
    serve = load_benchmark("serve_vs_vllm")
    rounds = [{"poisson": {"p99_ttft_ms": v, "mean_qoe": q, "note": None}}
              for v, q in ((300.0, 1.0), (100.0, 0.9), (200.0, 0.95))]
    assert serve.medians(rounds) == {"poisson": {"p99_ttft_ms": 200.0, "mean_qoe": 0.95,
                                                 "note": None}}


def test_bad_policy_or_rounds_exit_2() -> None:
    serve = load_benchmark("serve_vs_vllm")
    assert serve.main(["--policy", "nope", "--skip-vllm"]) == 2
    assert serve.main(["--rounds", "0", "--skip-vllm"]) == 2
