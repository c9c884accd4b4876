"""`andante experiment fastserve --quick` writes its report (CI smoke test)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.fastserve import mlfq_share
from experiments.fastserve_runs import max_rate_within
from experiments.registry import ExperimentContext, experiment_names, run_experiment


def test_max_rate_is_read_off_the_curve() -> None:
    rates = [1.0, 2.0, 3.0]
    assert max_rate_within(rates, [0.1, 0.2, 0.4], 0.3) == (pytest.approx(2.5), "")
    assert max_rate_within(rates, [0.1, 0.2, 0.25], 0.3) == (3.0, ">=")
    assert max_rate_within(rates, [0.5, 0.6, 0.7], 0.3) == (1.0, "<")
    assert max_rate_within(rates, [0.1, math.nan, 0.2], 0.3) == (1.0, "")


def test_mlfq_share_of_the_gain_over_vllm() -> None:
    assert mlfq_share({"vllm": 4.0, "fastserve-fcfs": 2.0}) == pytest.approx(0.5)
    assert mlfq_share({"vllm": 2.0, "fastserve-fcfs": 2.0}) == pytest.approx(1.0)
    assert math.isnan(mlfq_share({"vllm": math.nan, "fastserve-fcfs": 2.0}))
    assert math.isnan(mlfq_share({"vllm": 1.0, "fastserve-fcfs": 1.0}))


@pytest.mark.slow
def test_quick_experiment_writes_report_plots_and_results(tmp_path: Path) -> None:
    assert "fastserve" in experiment_names()
    report = run_experiment("fastserve", ExperimentContext(tmp_path, quick=True))
    assert (tmp_path / "report.md").read_text().startswith("# FastServe")
    for name in ("fig11_average_latency", "fig12_p95_latency", "fig8_kv_memory",
                 "fig15_kv_modes"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True and results["setups"]
    for panel in results["setups"]:
        assert set(panel["curves"]) == {"vllm", "fastserve-fcfs", "fastserve"}
        assert all(n > 0 for n in panel["curves"]["fastserve"]["finished"])
    assert report.results["fig8"]["peak_gb"]["fastserve"] > 0
    rows = {row["policy"]: row for row in report.results["memory_bound"]}
    assert rows["fastserve"]["preemptions / request"] <= 2
    assert rows["fastserve"]["makespan (s)"] <= 1.1 * rows["fastserve-fcfs"]["makespan (s)"]
