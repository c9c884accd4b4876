"""The Ascendra reproduction: its sweep helper and its quick report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.ascendra_runs import rate_at_target
from experiments.registry import ExperimentContext, experiment_names, run_experiment


def test_rate_at_target_is_read_off_the_curve() -> None:
    assert rate_at_target([1, 2, 3], [1.0, 0.95, 0.85]) == (pytest.approx(2.5), "")
    assert rate_at_target([1, 2, 3], [0.99, 0.95, 0.91]) == (3, ">=")
    assert rate_at_target([1, 2, 3], [0.5, 0.4, 0.3]) == (1, "<")


@pytest.mark.slow
def test_quick_experiment_writes_report_plots_and_results(tmp_path: Path) -> None:
    assert "ascendra" in experiment_names()
    report = run_experiment("ascendra", ExperimentContext(tmp_path, quick=True))
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# Ascendra") and "Against the paper" in text
    for name in ("fig9_goodput_vs_qps", "fig9_goodput_vs_slo_scale", "fig13_pools",
                 "fig12_overload", "perf_model_error"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True and len(results["sweep"]) == 2
    for run in report.results["overload"]["runs"]:
        counts = run["counts"]
        assert counts["ascendra"]["good"] > 0 and set(counts) == {"vllm", "sarathi", "ascendra"}
