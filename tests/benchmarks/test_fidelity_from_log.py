"""benchmarks/fidelity_from_log.py without its servers: the commands that make each engine
log its steps, the calibration of the log's first part, the simulated side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.paths import ANDANTE_HOME_ENV
from tests.benchmarks.scripts import load_benchmark
from tests.perf.steplogs import logged_steps, write_log

ffl = load_benchmark("fidelity_from_log")


def test_each_engine_is_told_to_log_its_steps(tmp_path: Path):
    log = tmp_path / "steps.jsonl"
    andante = ffl.server_command(ffl.parse_args(["--engine", "andante"]), 8001, log)
    assert andante[andante.index("--trace-steps") + 1] == str(log)
    vllm = ffl.server_command(ffl.parse_args(["--engine", "vllm"]), 8002, log)
    assert vllm[vllm.index("--scheduler-cls") + 1] == "andante.vllm.Scheduler"
    # and its API server to time each streamed response (the front end's HTTP side)
    assert vllm[vllm.index("--middleware") + 1] == "andante.server.http_timing.HttpTiming"
    config = json.loads(vllm[vllm.index("--additional-config") + 1])
    assert config == {"andante": {"policy": "vllm", "step_log": str(log)}}
    for cmd in (andante, vllm):  # the same limits as the simulated engine's
        assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "2048"


def test_the_calibration_part_of_the_log_is_fitted_and_simulated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    timed = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    records = logged_steps(timed, engine="andante")
    log = write_log(tmp_path / "steps.jsonl", records + [{"kind": "step", "duration": -1}])
    fit = ffl.calibrate(log, len(records), tmp_path / "calibration.jsonl")  # not the last
    assert fit["fit_error"] == 0.0 and fit["num_steps"] == len(records)
    assert fit["idle_wake"] == 0.0 and "no end times" in fit["idle_wake_note"]
    args = ffl.parse_args([])
    sim = ffl.simulated(args, ffl.workload(args, 1.0, 0, "uniform:32:64:4:8", 5))
    assert sim["num_finished"] == 5 and sim["ttft_mean_ms"] > 0
    wakeless = get_hardware(ffl.WAKELESS_PROFILE)  # the comparison: no wake, same steps
    assert wakeless.idle_wake == 0.0
    assert wakeless.coefficients == get_hardware(ffl.PROFILE).coefficients

