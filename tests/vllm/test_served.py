"""`vllm serve --scheduler-cls andante.vllm.Scheduler` on the real vLLM CPU build, next to
vLLM's own scheduler with the same limits (both started once for the module, in
parallel): OpenAI requests answered, greedy outputs token-identical, SLOs through
vllm_xargs, an aborted stream's blocks freed, preemptions on /metrics and in the
policy's log, and the step log `andante calibrate --step-log` fits (slow: ~3 min)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from andante.cli.main import main
from andante.perf.paths import ANDANTE_HOME_ENV
from tests.peers import VllmPeer
from tests.vllm.served import MODEL, Served, complete, start, stop, stream, wait_ready

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Write a haiku about the sea:", "def fibonacci(n):",
           "List three primary colors:", "Once upon a time, in a small village,",
           "The meaning of life is"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-served")


@pytest.fixture(scope="module")
def servers(vllm_peer: VllmPeer, workdir: Path) -> Iterator[dict[str, Served]]:
    andante = {"policy": "andes", "log_interval": 1, "step_log": str(workdir / "steps.jsonl")}
    procs = {"andes": start(vllm_peer, workdir / "andes.log", andante),
             "vllm": start(vllm_peer, workdir / "vllm.log")}
    try:
        yield {name: wait_ready(proc, workdir / f"{name}.log") for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            stop(proc)


def test_greedy_outputs_are_token_identical_to_vllms_scheduler(
        servers: dict[str, Served]) -> None:
    def run(url: str) -> list[dict]:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            return list(pool.map(lambda p: complete(url, p, 24), PROMPTS))

    ours, theirs = run(servers["andes"].url), run(servers["vllm"].url)
    for a, b in zip(ours, theirs, strict=True):
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert "Paris" in ours[0]["choices"][0]["text"]


def test_chat_and_stream_with_slos_in_vllm_xargs(servers: dict[str, Served]) -> None:
    url = servers["andes"].url
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8, "vllm_xargs": {"ttft": 0.5, "tds": 10, "deadline": 30}})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"]
    chunks = []
    with httpx.stream("POST", f"{url}/v1/completions", timeout=300, json={
            "model": MODEL, "prompt": "Count: one, two,", "max_tokens": 6, "stream": True,
            "vllm_xargs": {"tbt": 0.2}}) as reply:
        assert reply.status_code == 200
        chunks = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]" and len(chunks) >= 3


def test_a_bad_slo_fails_its_request_and_the_log_says_why(servers: dict[str, Served]) -> None:
    reply = httpx.post(f"{servers['andes'].url}/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": "Hi", "max_tokens": 4, "vllm_xargs": {"tds": -2}})
    assert reply.status_code >= 400
    assert "vllm_xargs: tds must be a positive finite number" in servers["andes"].text()


def test_an_aborted_stream_frees_its_blocks(servers: dict[str, Served]) -> None:
    served = servers["andes"]
    with httpx.stream("POST", f"{served.url}/v1/completions", timeout=300, json={
            "model": MODEL, "prompt": "hello " * 300, "max_tokens": 600,
            "ignore_eos": True, "stream": True}) as reply:
        lines = reply.iter_lines()
        for _ in range(5):
            next(lines)
        assert served.metric("vllm:kv_cache_usage_perc") > 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if served.metric("vllm:num_requests_running") == 0 and \
                served.metric("vllm:kv_cache_usage_perc") == 0:
            return
        time.sleep(0.5)
    pytest.fail("the aborted request still holds KV blocks after 60 s")


def test_preemptions_show_on_metrics_and_in_the_policys_log(
        servers: dict[str, Served]) -> None:
    served = servers["andes"]
    with ThreadPoolExecutor(8) as pool:  # 8 x ~350 tokens in a cache of 1,536
        list(pool.map(lambda n: complete(served.url, "hello " * (150 + 10 * n), 150,
                                         ignore_eos=True, temperature=1.0), range(8)))
    assert served.metric("vllm:num_preemptions_total") > 0
    log = served.text()
    assert "andante.vllm: policy andes" in log
    assert "andante.vllm [andes]: running" in log and "preemptions kv" in log


def _calibration_load(url: str) -> None:
    """Three waves of eight requests, prompts of 16 to 900 tokens and short outputs, each
    wave opened by one streamed request alone (so that some request finds the engine idle
    however loaded the machine is):
    prefills of many sizes, alone and mixed with decodes, and decode batches of 1 to 8
    (few of them: on a shared machine the small model's decode steps are mostly noise)."""
    def one(n: int) -> None:
        if n % 2:  # streamed: the HTTP timing middleware records these
            assert stream(url, "hello " * (16 + 37 * n), 2 + n % 4) >= 2
        else:
            complete(url, "hello " * (16 + 37 * n), 2 + n % 4, ignore_eos=True)

    with ThreadPoolExecutor(8) as pool:
        for wave in range(3):
            numbers = list(range(wave, 24, 3))
            alone = next(n for n in numbers if n % 2)  # streamed, on an idle engine: the
            one(alone)  # front end's own time before the engine is measured on it
            list(pool.map(one, [n for n in numbers if n != alone]))


def test_the_step_log_calibrates_a_profile(servers: dict[str, Served], workdir: Path,
                                           vllm_peer: VllmPeer,
                                           monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    log = workdir / "steps.jsonl"
    log.write_text("")  # this load's steps only (the server appends to the file)
    _calibration_load(servers["andes"].url)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and all(r["engine"] == "vllm" and r["policy"] == "andes" for r in steps)
    # every request's engine side; the streamed ones' HTTP side (12 of the 24)
    assert sum(r["kind"] == "request" for r in records) == 24
    assert sum(r["kind"] == "http" for r in records) == 12
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(workdir / "home"))
    # the fit's error on this shared 2-core machine is not the point: that it fits is
    code = main(["calibrate", "--step-log", str(log), "--model", str(vllm_peer.model),
                 "--base-hardware", "cpu", "--name", "vllm-cpu", "--max-error", "1.0",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    fit = json.loads(out)
    assert fit["engines"] == ["vllm"] and fit["num_shapes"] >= 6
    assert {"decode", "prefill"} <= set(fit["by_kind"]) or \
        {"decode", "mixed"} <= set(fit["by_kind"])
    assert fit["saved_to"]
    # the front end: measured on both sides of the engine for the streamed requests
    assert fit["num_request_records"] == 24 and fit["num_matched_http"] == 12
    assert fit["frontend_in"] > 0 and fit["frontend_out"] > 0 and not fit["frontend_note"]


def test_an_unknown_policy_stops_startup_with_one_line(vllm_peer: VllmPeer,
                                                       workdir: Path) -> None:
    log = workdir / "nope.log"
    proc = start(vllm_peer, log, {"policy": "nope"})
    try:
        proc.wait(300)
    finally:
        stop(proc)
    assert proc.returncode != 0
    assert "andante.vllm: unknown policy 'nope'; andante.vllm runs: andes," in log.read_text()
