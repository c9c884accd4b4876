"""`andante experiment andes --quick` writes its report, plots and results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.andes_report import sustained
from experiments.registry import ExperimentContext, experiment_names, run_experiment


def test_sustained_intensity_interpolates_the_first_crossing() -> None:
    assert sustained([1, 2, 3], [0.99, 0.97, 0.5]) == pytest.approx(2 + 0.02 / 0.47)
    assert sustained([1, 2], [0.9, 0.99]) is None
    assert sustained([1, 2], [0.99, 0.98]) == 2


@pytest.mark.slow
def test_quick_experiment_writes_a_report(tmp_path: Path) -> None:
    assert "andes" in experiment_names()
    report = run_experiment("andes", ExperimentContext(tmp_path, quick=True))
    text = (tmp_path / "report.md").read_text()
    for heading in ("Headline", "Fig. 15", "Fig. 17", "Fig. 18", "Fig. 20", "Real trace"):
        assert heading in text
    assert (tmp_path / "fig15_intensity.png").stat().st_size > 1000
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True and "headline" in results
    qoe = results["fig15"]["qoe"]
    panel = next(iter(qoe.values()))
    assert panel["andes"][-1] > panel["vllm"][-1]  # the heavier burst
    assert report.directory == tmp_path
