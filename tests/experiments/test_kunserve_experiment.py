"""`andante experiment kunserve --quick` writes its report; the baselines' specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.core.request import PreemptionMode
from experiments.kunserve_runs import base_spec, cyclic, demand_scaling, system_spec
from experiments.registry import ExperimentContext, experiment_names, run_experiment


def test_systems_are_the_papers_baselines() -> None:
    spec = base_spec("qwen2.5-14b", "a100-80g", 1, 4)
    assert system_spec(spec, "vllm") == spec
    pp = system_spec(spec, "vllm-pp")
    assert (pp.pp, pp.num_instances) == (2, 2)
    swap = system_spec(spec, "infercept")
    assert swap.scheduler.preemption_mode == PreemptionMode.SWAP and swap.overlap_swaps
    kun = system_spec(spec, "kunserve", lookahead=False)
    assert kun.router == "kunserve" and kun.router_options == {"lookahead": False}
    assert system_spec(spec, "llumnix").router == "llumnix"
    with pytest.raises(ValueError):
        system_spec(spec, "nope")
    burst = cyclic(4.0, 120.0, seed=0, intensity=3.0)
    first = [r for r in burst if r.arrival_time < 24.0]
    assert len(first) > 0.3 * len(burst)  # 3x the rate over 20% of the cycle


def test_rates_follow_littles_law_on_kv_memory() -> None:
    spec = base_spec("qwen2.5-14b", "a100-80g", 1, 4)
    half, most = demand_scaling(spec, 0.5), demand_scaling(spec, 0.8)
    assert half.capacity_tokens > 4 * 200_000  # ~232k KV tokens per A100 instance
    assert half.kv_bytes_per_token == 2 * 48 * 8 * 128 * 2  # 14B: 48 layers, 8 KV heads
    resident = half.mean_prompt + half.mean_output / 2
    demand = half.rate * half.mean_output * half.tpot_s * resident  # Little's law
    assert abs(demand - 0.5 * half.capacity_tokens) < 1e-6 * half.capacity_tokens
    assert most.rate > half.rate and most.tpot_s > half.tpot_s  # more prefill, slower


@pytest.mark.slow
def test_quick_experiment_writes_report_plots_and_results(tmp_path: Path) -> None:
    assert "kunserve" in experiment_names()
    run_experiment("kunserve", ExperimentContext(tmp_path, quick=True))
    assert (tmp_path / "report.md").read_text().startswith("# KunServe")
    for name in ("cyclic_14b_timeline", "cyclic_14b_slo", "cyclic_72b_timeline"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True
    assert {row["system"] for row in results["cyclic_14b"]} == {
        "vllm", "vllm-pp", "infercept", "llumnix", "kunserve"}
    rows = {row["system"]: row for row in results["cyclic_14b"]}
    assert all(row["unfinished"] == 0 for row in rows.values())  # no request lost
    assert len({row["requests"] for row in rows.values()}) == 1
    kun = rows["kunserve"]
    assert kun["drops"] >= 1 and kun["restores"] >= 1  # the burst formed a group, undone
    assert rows["vllm"]["drops"] == 0 and rows["vllm"]["peak_kv_use"] > 0.95
    assert kun["p99_ttft_s"] < rows["vllm"]["p99_ttft_s"]
    assert len(results["ablation"]) == 5 and results["p99_ttft_multiples"]
