"""Ascendra end to end in the simulator, and its experiment's quick report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.bench.experiment import ExperimentContext, experiment_names, run_experiment
from andante.bench.experiments.ascendra_runs import rate_at_target
from andante.bench.experiments.ascendra_setup import ASCENDRA, SETUPS, VLLM
from andante.metrics.slo import is_good_by_slo
from andante.sim import build_simulator, simulate
from andante.workload import to_requests


def test_two_lp_one_hp_serve_everything_with_offloads_and_tickets() -> None:
    setup = SETUPS[0]
    workload = setup.workload(12.0, 400, seed=2)  # well above three instances' capacity
    sim = build_simulator(ASCENDRA.spec(setup))
    requests = to_requests(workload)
    report = sim.run(requests)
    assert len(report.finished) == 400 and not report.unfinished
    router = sim.controller.router
    assert router.num_offloads > 0 and router.num_ticketed > 0  # type: ignore[attr-defined]
    roles = [inst.role for inst in sim.instances]
    assert roles == ["lp", "lp", "hp"]
    hp_policy = sim.instances[2].engine.scheduler.policy
    assert hp_policy.perf_model.error is not None  # type: ignore[attr-defined]
    ours = sum(is_good_by_slo(r) for r in simulate(ASCENDRA.spec(setup), workload).records)
    theirs = sum(is_good_by_slo(r) for r in simulate(VLLM.spec(setup), workload).records)
    assert ours > theirs  # overloaded FCFS loses more requests' SLOs


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
