"""benchmarks/idle_residuals.py: the residuals of steps after idle gaps, by gap length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.perf.paths import ANDANTE_HOME_ENV
from tests.benchmarks.scripts import load_benchmark
from tests.perf.test_idle_wake import GAPS, LLAMA, _log

residuals = load_benchmark("idle_residuals")


def test_the_steps_after_long_gaps_show_the_penalty_and_the_others_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join(_log(GAPS * 2, 0.020, 1.0)) + "\n", encoding="utf-8")
    fit_log = tmp_path / "fit.jsonl"  # the model fitted to steps without a wake
    fit_log.write_text("\n".join(_log(GAPS, 0.0, 1.0)) + "\n", encoding="utf-8")
    assert residuals.main(["--log", str(log), "--fit-log", str(fit_log), "--model",
                           LLAMA.name, "--base-hardware", "a100-80g"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["back_to_back"]["mean_ms"]) < 0.01
    assert out["after_idle_gap"]["1-2 s"]["mean_ms"] == pytest.approx(20.0, abs=0.01)
    assert out["after_idle_gap"]["0.25-0.5 s"]["mean_ms"] == pytest.approx(0.0, abs=0.01)
    assert out["second_step_after_1s_idle"]["n"] > 0
    assert residuals.main(["--log", str(tmp_path / "none.jsonl")]) == 2
