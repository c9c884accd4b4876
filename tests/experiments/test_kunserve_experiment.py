"""`andante experiment kunserve --quick` writes its report; the baselines' specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.core.request import PreemptionMode
from experiments.kunserve_runs import base_spec, cyclic, system_spec
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
    burst = cyclic(4.0, 60.0, seed=0)
    first = [r for r in burst if r.arrival_time < 12.0]
    assert len(first) > 0.3 * len(burst)  # 3x the rate over 20% of the cycle


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
    assert all(row["unfinished"] == 0 for row in results["cyclic_14b"])
    assert len(results["ablation"]) == 5 and results["p99_ttft_multiples"]
