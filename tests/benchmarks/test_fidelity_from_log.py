"""benchmarks/fidelity_from_log.py without its servers: the commands that make each engine
log its steps, the calibration of the log's first part, the simulated side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.step_log import parse_steps
from tests.benchmarks.scripts import load_benchmark
from tests.perf.steplogs import logged_steps

ffl = load_benchmark("fidelity_from_log")
ffd = load_benchmark("fidelity_decompose")


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


def test_the_calibration_segments_are_fitted_and_the_runs_simulated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    timed = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    records = logged_steps(timed, engine="andante")
    lines = [json.dumps(r) + "\n" for r in records + [{"kind": "step", "duration": -1}]]
    segments = [{"kind": "calibration", "lines": [0, len(records)]},
                {"kind": "run", "lines": [len(records), len(lines)]}]  # not fitted
    fit = ffl.calibrate(lines, segments, tmp_path / "calibration.jsonl")
    assert fit["fit_error"] == 0.0 and fit["num_steps"] == len(records)
    assert fit["idle_wake"] == 0.0 and "no end times" in fit["idle_wake_note"]
    assert fit["client_overhead"] is None  # no request or HTTP records to set it against
    factor_tables = {k for k in fit if k.endswith("_factors")}  # each one reported
    assert factor_tables == {"prefill_factors", "decode_factors"}
    assert factor_tables <= set(ffl.FIT_FIELDS) and set(ffl.FIT_FIELDS) <= set(fit)
    args = ffl.parse_args([])
    sim, requests = ffl.simulated(args, ffl.workload(args, 1.0, 0, "uniform:32:64:4:8", 5))
    assert sim["num_finished"] == 5 and sim["ttft_mean_ms"] > 0 and len(requests) == 5
    wakeless = get_hardware(ffl.WAKELESS_PROFILE)  # the comparison: no wake, same steps
    assert wakeless.idle_wake == 0.0
    assert wakeless.coefficients == get_hardware(ffl.PROFILE).coefficients


def _step(t: float, duration: float) -> str:
    return json.dumps({"kind": "step", "duration": duration, "num_tokens": 1,
                       "num_decode_seqs": 1, "num_context_tokens": 40, "t": t}) + "\n"


def test_calibration_segments_are_joined_without_a_false_idle_gap():
    lines = [_step(1.0, 0.1), _step(1.1, 0.1),  # calibration
             _step(5.0, 0.1),  # a run, between them
             _step(9.0, 0.1), _step(9.1, 0.1)]  # calibration again
    segments = [{"kind": "calibration", "lines": [0, 2]}, {"kind": "run", "lines": [2, 3]},
                {"kind": "calibration", "lines": [3, 5]}]
    joined = ffl.calibration_lines(lines, segments)
    steps = parse_steps(joined)
    assert len(steps) == 4 and [s.idle_before for s in steps[2:]] == [None, None]
    assert steps[1].idle_before == pytest.approx(0.0)


def _request(rid: str, received: float, seen: float, step_end_t: float, duration: float,
             first_byte: float, origin: float = 1000.0) -> list[str]:
    # in a vLLM log's order: the request record as its first token comes, the step, and
    # the HTTP record (another process) when its first byte is out
    return [json.dumps({"kind": "request", "id": rid + "-0", "arrival": received + 0.001,
                        "seen": seen, "idle": True, "first_token": origin + step_end_t})
            + "\n",
            json.dumps({"kind": "step", "duration": duration, "num_tokens": 64,
                        "num_decode_seqs": 2, "t": step_end_t}) + "\n",
            json.dumps({"kind": "http", "id": rid, "received": received,
                        "first_byte": first_byte}) + "\n"]


def test_a_requests_ttft_is_taken_apart_and_the_clients_share_measured():
    # received 1010.000, taken in at .004, its step runs .010-.110, first byte at .113
    lines = _request("a", 1010.0, 1010.004, 10.110, 0.100, 1010.113)
    lines += _request("b", 1020.0, 1020.006, 20.206, 0.180, 1020.209)
    real = ffd.real_requests(lines)
    assert [r.received for r in real] == [1010.0, 1020.0]
    a = real[0].parts
    assert a["to_engine"] == pytest.approx(0.004) and a["to_step"] == pytest.approx(0.006)
    assert a["step"] == pytest.approx(0.1) and a["to_first_byte"] == pytest.approx(0.003)
    assert real[0].ttft == pytest.approx(0.113) and real[0].num_decodes == 2
    segments = [{"kind": "calibration", "lines": [0, len(lines)],
                 "client_ttft_sum": 0.113 + 0.209 + 2 * 0.005}]
    assert ffl.client_overhead(lines, segments) == pytest.approx(0.005)
    parts = ffd.decomposition(real, [], client_ttft_ms=166.0)
    assert parts["real"]["step"] == 140.0 and parts["client_ms"] == pytest.approx(5.0)


def test_a_log_recorded_before_segments_is_split_by_its_request_records(tmp_path: Path):
    calibration = [_step(1.0, 0.1), _step(1.1, 0.1)]
    runs = [_request(rid, 1010.0 + i, 1010.001 + i, 10.1 + i, 0.05, 1010.11 + i)
            for i, rid in enumerate("abcd")]
    lines = calibration + [line for request in runs for line in request]
    (tmp_path / "vllm-calibration.jsonl").write_text("".join(calibration))
    (tmp_path / "vllm-steps.jsonl").write_text("".join(lines))
    real = {"ttft_mean_ms": 100.0, "tpot_mean_ms": 30.0, "num_finished": 2}
    (tmp_path / "out.json").write_text(json.dumps(
        {"runs": [{"rate": 0.5, "real": real}, {"rate": 1.0, "real": real}]}))
    args = ffl.parse_args(["--engine", "vllm", "--replay", str(tmp_path),
                           "--num-requests", "2", "--seed", "7"])
    segments = ffl.recorded_segments(args, lines)
    assert [s["kind"] for s in segments] == ["calibration", "run", "run"]
    assert segments[0]["lines"] == [0, 2]
    assert segments[1]["lines"] == [2, 8] and segments[2]["lines"] == [8, 14]
    assert [s["seed"] for s in segments[1:]] == [7, 8]
    with pytest.raises(SystemExit, match="do not make 3 runs"):
        (tmp_path / "out.json").write_text(json.dumps({"runs": [{"rate": 1, "real": real}] * 3}))
        ffl.recorded_segments(args, lines)


def test_andantes_request_records_are_taken_apart_on_its_own_clock():
    origin = 1000.0  # the engine clock's zero on the wall clock
    lines = [json.dumps({"kind": "http", "id": "r1", "received": 1010.0,
                         "first_byte": 1010.125}) + "\n",
             json.dumps({"kind": "step", "duration": 0.09, "num_tokens": 67,
                         "num_decode_seqs": 3, "t": 10.12, "prefill_ids": ["r1"]}) + "\n",
             json.dumps({"kind": "request", "id": "r1", "arrival": 10.001, "seen": 10.004,
                         "first_scheduled": 10.03, "first_token": 10.12, "idle": False,
                         "origin": origin}) + "\n"]
    (real,) = ffd.real_requests(lines)
    assert real.parts == pytest.approx({"to_engine": 0.004, "to_step": 0.026, "step": 0.09,
                                        "to_first_byte": 0.005})
    assert real.num_decodes == 3 and not real.idle


def test_a_run_segment_is_simulated_with_its_own_workload():
    args = ffl.parse_args([])
    assert args.passes == 2 and args.interleave_requests > 0
    recorded = {"rate": 2.0, "seed": 5, "num_requests": 6, "lengths": "uniform:8:16:2:4"}
    config = ffl.run_workload(args, recorded)
    assert (config.rate, config.seed, config.num_requests, config.lengths) == (
        2.0, 5, 6, "uniform:8:16:2:4")
    old = ffl.run_workload(args, {"rate": 1.0, "seed": 1})  # a log recorded before
    assert (old.num_requests, old.lengths) == (args.num_requests, args.lengths)
