"""benchmarks/serve_vllm_client.py: the vllm bench serve runs it asks for, and medians."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_benchmark


def test_one_run_per_load_and_backend() -> None:
    bench = load_benchmark("serve_vllm_client")
    args = bench.parse_args(["--loads", "c16,poisson2,burst2", "--backends",
                             "openai,openai-chat", "--poisson-prompts", "30"])
    runs = bench.bench_runs(args, "http://127.0.0.1:1", Path("/tmp/x"))
    assert len(runs) == 6
    names = [r[r.index("--result-filename") + 1] for r in runs]
    assert names[0] == "c16-openai.json" and names[-1] == "burst2-openai-chat.json"
    assert "--max-concurrency" in runs[0] and "--burstiness" in runs[-1]
    assert runs[2][runs[2].index("--num-prompts") + 1] == "30"
    assert all("--ignore-eos" in r and "ttft:1000" in r for r in runs)


def test_unknown_loads_are_refused() -> None:
    bench = load_benchmark("serve_vllm_client")
    with pytest.raises(SystemExit):
        bench.parse_args(["--loads", "c32"])


def test_medians_over_rounds() -> None:
    bench = load_benchmark("serve_vllm_client")
    figures = [{"c16-openai": {f: v for f in bench.FIGURES}} for v in (1.0, 3.0, 2.0)]
    med = bench.medians([{"figures": f} for f in figures])
    assert med["c16-openai"]["output_throughput"] == 2.0
