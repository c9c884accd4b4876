"""`andante calibrate --step-log`: a profile from any engine's step log, saved where
`andante simulate --hardware NAME` finds it; a thin log refused with what is missing.
Profiles go to a temporary ANDANTE_HOME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.cli.main import main
from andante.perf.catalog import describe_hardware, get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.step_log import read_step_log
from tests.perf.steplogs import logged_steps, write_log

LLAMA = get_model("llama-3.1-8b")
#: the profile the synthetic log's engine "ran on": H100 rates, other coefficients
TRUTH = get_hardware("h100-80g").with_coefficients(get_hardware("a100-80g").coefficients)


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    return tmp_path


def _log(tmp_path: Path, records=None) -> str:
    records = logged_steps(CostModel(LLAMA, TRUTH), engine="vllm") * 2 \
        if records is None else records
    return str(write_log(tmp_path / "steps.jsonl", records))


def test_a_vllm_log_becomes_a_profile_that_simulate_uses(tmp_path, capsys):
    log = _log(tmp_path)
    argv = ["calibrate", "--step-log", log, "--model", "llama-3.1-8b",
            "--base-hardware", "h100-80g", "--name", "my-h100"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mean |error| of the fit 0.0% over 24 logged steps of vllm" in out
    assert "andante simulate --hardware my-h100 --model llama-3.1-8b" in out
    saved = get_hardware("my-h100")
    assert saved.fit_error == 0.0 and saved.mem_capacity == TRUTH.mem_capacity
    for step in read_step_log(log):
        assert CostModel(LLAMA, saved).step_time(step.shape) == pytest.approx(step.duration)
    assert "fitted on step log" in describe_hardware("my-h100")
    sim = ["simulate", "--no-progress", "--hardware", "my-h100", "--model", "llama-3.1-8b",
           "--num-requests", "4", "--lengths", "uniform:64:128:8:16", "--json"]
    assert main(sim) == 0
    assert json.loads(capsys.readouterr().out)["profile_fit_error"] == 0.0
    assert main([*argv, "--json"]) == 0  # again: the first is kept under a dated name
    record = json.loads(capsys.readouterr().out)
    assert record["engines"] == ["vllm"] and record["previous_saved_as"].startswith("my-h100-")


def test_a_model_directory_gives_the_model_shape(tmp_path, capsys):
    model_dir = tmp_path / "SmolLM2-135M"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
        "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True}))
    small = CostModel(get_model("smollm2-135m"), TRUTH)
    log = _log(tmp_path, logged_steps(small, engine="andante"))
    assert main(["calibrate", "--step-log", log, "--model", str(model_dir),
                 "--base-hardware", "cpu", "--name", "cpu-smol", "--dry-run"]) == 0
    assert "fit 0.0%" in capsys.readouterr().out


@pytest.mark.parametrize(("records", "message"), [
    ([], "no step records"),
    ("decodes", "no prefill steps"),
    ("one-request", "distinct step shapes"),
])
def test_a_thin_log_is_refused_with_what_is_missing(tmp_path, capsys, records, message):
    timed = CostModel(LLAMA, TRUTH)
    if records == "decodes":
        records = [r for r in logged_steps(timed) if r["num_prefill_tokens"] == 0]
    elif records == "one-request":
        records = logged_steps(timed, [((500, 0),)] + [((1, 500 + i),) for i in range(50)])
    argv = ["calibrate", "--step-log", _log(tmp_path, records), "--model", "llama-3.1-8b",
            "--base-hardware", "h100-80g", "--name", "thin"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("andante calibrate: error:") and message in err
    assert not (tmp_path / "home" / "hardware" / "thin.json").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "llama-3.1-8b", "--base-hardware", "h100-80g"], "needs --name"),
    (["--base-hardware", "h100-80g", "--name", "x"], "needs --model"),
    (["--model", "llama-3.1-8b", "--name", "x"], "needs --base-hardware"),
    (["--model", "no-such", "--base-hardware", "h100-80g", "--name", "x"], "neither"),
    (["--model", "llama-3.1-8b", "--base-hardware", "h100-80g", "--name", "h200"],
     "built-in hardware name"),
])
def test_missing_or_bad_options_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    assert main(["calibrate", "--step-log", _log(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_step_log_options_without_a_step_log_are_refused(capsys):
    assert main(["calibrate", "--base-hardware", "h100-80g"]) == 2
    assert "go with --step-log" in capsys.readouterr().err


def _frontend_records(num: int) -> list[dict]:
    """Request records (the engine's side, vLLM's suffixed ids) and the HTTP timing
    middleware's records: 30 ms before the engine, 50 ms after it, per request."""
    out: list[dict] = []
    for i in range(num):
        t = 100.0 + i
        out.append({"kind": "http", "id": f"cmpl-{i}", "received": t,
                    "first_byte": t + 0.030 + 0.2 + 0.050})
        out.append({"kind": "request", "id": f"cmpl-{i}-0-abcdef12", "arrival": t + 0.010,
                    "seen": t + 0.030, "first_token": t + 0.230})
    return out


def test_the_front_end_is_fitted_into_the_profile(tmp_path, capsys):
    steps = logged_steps(CostModel(LLAMA, TRUTH), engine="vllm") * 2
    log = _log(tmp_path, steps + _frontend_records(5))
    argv = ["calibrate", "--step-log", log, "--model", "llama-3.1-8b",
            "--base-hardware", "h100-80g", "--name", "fronted"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "front end: 30.0 ms before the engine, 50.0 ms after it (5 request records, " \
        "5 matched to http records)" in out and "note:" not in out
    saved = get_hardware("fronted")
    assert saved.frontend_in == pytest.approx(0.030)
    assert saved.frontend_out == pytest.approx(0.050)


def test_a_log_without_request_records_assumes_no_front_end_and_says_so(tmp_path, capsys):
    argv = ["calibrate", "--step-log", _log(tmp_path), "--model", "llama-3.1-8b",
            "--base-hardware", "h100-80g", "--name", "plain", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["frontend_in"] == 0.0 and record["frontend_out"] == 0.0
    assert "assumed to take 0 s" in record["frontend_note"]
    assert main(argv[:-1] + ["--force"]) == 0
    assert "note: the log has no request records" in capsys.readouterr().out
    assert get_hardware("plain").frontend_in == 0.0


def test_malformed_front_end_records_are_refused(tmp_path, capsys):
    steps = logged_steps(CostModel(LLAMA, TRUTH), engine="vllm") * 2
    bad = {"kind": "http", "id": "cmpl-0", "received": "at noon", "first_byte": 1.0}
    log = _log(tmp_path, steps + [bad])
    argv = ["calibrate", "--step-log", log, "--model", "llama-3.1-8b",
            "--base-hardware", "h100-80g", "--name", "bad-front"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"line {len(steps) + 1}: a http record needs 'received' as a number" in err
    with pytest.raises(ValueError):
        get_hardware("bad-front")


def _timed(records: list[dict], idle: dict[int, float], penalty: float) -> list[dict]:
    """`records` with end times `t`: back to back, but `idle[i]` seconds before record i,
    which then takes `penalty` longer (a wake-up from 1 s idle on)."""
    t, out = 0.0, []
    for index, record in enumerate(records):
        gap = idle.get(index, 0.0)
        duration = record["duration"] + (penalty if gap >= 1.0 else 0.0)
        t += gap + duration
        out.append({**record, "duration": duration, "t": t})
    return out


def test_the_idle_wake_is_fitted_into_the_profile_and_reported(tmp_path, capsys):
    steps = logged_steps(CostModel(LLAMA, TRUTH), engine="vllm") * 4
    prompts = [i for i, r in enumerate(steps) if r["num_decode_seqs"] == 0]
    idle = {i: (0.3 if n % 3 == 0 else 2.0) for n, i in enumerate(prompts)}
    argv = ["calibrate", "--step-log", _log(tmp_path, _timed(steps, idle, 0.004)),
            "--model", "llama-3.1-8b", "--base-hardware", "h100-80g", "--name", "woken"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "idle wake: 4.0 ms more for a step after 1.15 s or more without one" in out
    saved = get_hardware("woken")
    assert saved.idle_wake == pytest.approx(0.004, rel=0.01) and 0.3 < saved.idle_wake_after <= 2.0


def test_a_log_without_idle_gaps_fits_no_wake_and_says_so(tmp_path, capsys):
    steps = _timed(logged_steps(CostModel(LLAMA, TRUTH), engine="vllm") * 2, {}, 0.0)
    argv = ["calibrate", "--step-log", _log(tmp_path, steps), "--model", "llama-3.1-8b",
            "--base-hardware", "h100-80g", "--name", "awake", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["idle_wake"] == 0.0 and record["num_idle_steps"] == 0
    assert "only 0 steps followed an idle gap" in record["idle_wake_note"]
    assert get_hardware("awake").idle_wake == 0.0
