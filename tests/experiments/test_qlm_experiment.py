"""`andante experiment qlm --quick` writes its report (CI smoke test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.qlm_runs import base_spec, mixed_hardware, system_spec
from experiments.registry import ExperimentContext, experiment_names, run_experiment


def test_systems_are_the_papers_baselines() -> None:
    spec = base_spec(("mistral-7b", "vicuna-13b"), 2)
    qlm = system_spec(spec, "qlm", delta=2.0)
    assert (qlm.router, qlm.policy, qlm.auto_preemption) == ("qlm", "edf", True)
    assert qlm.router_options == {"delta": 2.0}
    assert (system_spec(spec, "vllm").router, system_spec(spec, "vllm").policy) == (
        "round-robin", "vllm")
    assert system_spec(spec, "shepherd").policy == "static-batch"
    mixed = mixed_hardware(spec, 1)
    assert [mixed.instance_spec(i).hardware for i in range(2)] == ["a10-24g", "a100-80g"]


@pytest.mark.slow
def test_quick_experiment_writes_report_plots_and_results(tmp_path: Path) -> None:
    assert "qlm" in experiment_names()
    run_experiment("qlm", ExperimentContext(tmp_path, quick=True))
    assert (tmp_path / "report.md").read_text().startswith("# QLM")
    for name in ("fig8_wa_tail_share", "fig9_wa_latency_share", "fig12_wb_latency_share",
                 "fig10_ablation_wa", "fig13_ablation_wb", "wc_mega_prompts"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True
    tail = results["fig8_wa_tail_share"]["curves"]
    assert set(tail) == {"qlm", "vllm", "edf", "shepherd"}
    assert all(0.0 <= v <= 1.0 for c in tail.values() for v in c["slo_attainment"])
    assert results["fig19_planner"] and results["fig10_ablation_wa"][0]["variant"].startswith("QLM")
