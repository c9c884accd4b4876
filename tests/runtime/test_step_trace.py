"""`andante serve --trace-steps`: the step and request trace of a served engine."""

from __future__ import annotations

import io
import json
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from andante.core import ManualClock, Request, SamplingParams
from andante.engine.config import SchedulerConfig
from andante.exec.batch import StepBatch, StepResult
from andante.llm import build_engine
from andante.perf.step_log import parse_steps
from andante.runtime.step_trace import StepTrace
from andante.server import ServerThread
from andante.server.toy import ToyExecutor
from tests.server.helpers import toy_options

STEP_S, OVERHEAD_S = 0.05, 0.01


class TimedToy(ToyExecutor):
    """Each step takes STEP_S on the manual clock, of which the executor reports all
    but OVERHEAD_S as its own duration (the rest stands for scheduling)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(step_time=0.0)
        self.clock = clock

    def execute(self, batch: StepBatch) -> StepResult:
        result = super().execute(batch)
        self.clock.advance_to(self.clock.now() + STEP_S)
        return StepResult(result.sampled_token_ids, duration=STEP_S - OVERHEAD_S)


def _request(rid: str, prompt: int, arrival: float) -> Request:
    return Request(request_id=rid, prompt_token_ids=list(range(1, prompt + 1)),
                   sampling=SamplingParams(max_tokens=3, ignore_eos=True), arrival_time=arrival)


def _trace_run(token_budget: int, threads=None) -> tuple[list[dict], list[dict]]:
    clock = ManualClock()
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=token_budget,
                             max_model_len=512)
    engine = build_engine(TimedToy(clock), clock, "vllm", config)
    out = io.StringIO()
    trace = StepTrace(out, clock, threads=threads)
    engine.add_observer(trace)
    for i, prompt in enumerate((40, 100)):
        req = _request(f"r{i}", prompt, arrival=clock.now())
        clock.advance_to(clock.now() + 0.002)  # reaches the engine a little later
        trace.seen(req)
        engine.add_request(req)
    while engine.has_work:
        engine.step()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    return steps, [r for r in records if r["kind"] == "request"]


def test_trace_records_every_step_and_request() -> None:
    steps, requests = _trace_run(token_budget=64)
    assert {r["id"] for r in requests} == {"r0", "r1"}
    assert steps[0]["overhead"] is None  # the engine was idle before it
    assert all(s["overhead"] == pytest.approx(OVERHEAD_S) for s in steps[1:-1])
    by_id = {r["id"]: r for r in requests}
    # r1's 100-token prompt shares the 64-token budget with r0's 40: three chunks
    assert by_id["r0"]["prefill_steps"] == 1
    assert by_id["r1"]["prefill_steps"] == 3
    assert sum("r1" in s["prefill_ids"] for s in steps) == 3
    for r in requests:
        assert r["seen"] + r["origin"] <= time.time()  # on the wall clock by its origin
        assert r["to_engine"] == pytest.approx(0.002)
        assert r["ttft"] == pytest.approx(r["to_engine"] + r["queue"] + r["prefill"])
        assert r["output"] == 3 and r["num_preemptions"] == 0
    assert by_id["r1"]["prefill"] == pytest.approx(3 * STEP_S)


def test_step_records_carry_the_shape_a_step_log_fit_reads() -> None:
    steps, _ = _trace_run(token_budget=64)
    logged = parse_steps(json.dumps(s) for s in steps)
    assert len(logged) == len(steps)
    first, last = logged[0], logged[-1]
    # step 1: r0's whole 40-token prompt and r1's first 24 tokens, both from empty caches
    assert (first.shape.num_seqs, first.shape.num_tokens) == (2, 64)
    assert first.shape.num_decode_seqs == 0 and steps[0]["num_prefill_tokens"] == 64
    assert first.shape.attn_pairs == (40 * 41 + 24 * 25) / 2 and first.exact_shape
    assert {s.engine for s in logged} == {"andante"}
    # the last step decodes r1 alone, its 100-token prompt and 2 tokens in its cache
    assert last.kind == "decode" and steps[-1]["num_context_tokens"] == 101
    # a step costs its forward pass and the server's overhead before it (the whole
    # cycle a served token pays); the first step after the engine ran dry has no overhead
    assert last.shape.kv_tokens_read == 102 and last.duration == pytest.approx(STEP_S)
    assert steps[0]["overhead"] is None and first.duration == pytest.approx(
        STEP_S - OVERHEAD_S)
    # each step follows the one before at once: no idle gap (andante.perf.idle_wake)
    assert first.idle_before is None
    assert all(s.idle_before == pytest.approx(0.0, abs=1e-9) for s in logged[1:])


def test_the_trace_records_each_steps_threads_where_it_can_read_them() -> None:
    counts = iter(range(1, 1000))
    steps, _ = _trace_run(token_budget=64, threads=lambda: next(counts))
    assert [s["threads"] for s in steps] == list(range(1, len(steps) + 1))
    plain, _ = _trace_run(token_budget=64)
    assert all("threads" not in s for s in plain)


def test_a_larger_budget_prefills_in_fewer_steps() -> None:
    _, requests = _trace_run(token_budget=256)
    assert all(r["prefill_steps"] == 1 for r in requests)


def test_served_toy_writes_its_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace" / "steps.jsonl"
    server = ServerThread(replace(toy_options(), trace_steps=str(path))).start()
    try:
        reply = httpx.post(f"{server.url}/v1/completions", timeout=30,
                           json={"model": "toy", "prompt": "hello there", "max_tokens": 4})
        assert reply.status_code == 200
    finally:
        server.stop()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    (request,) = [r for r in records if r["kind"] == "request"]
    assert request["output"] == 4 and request["seen"] >= request["arrival"]
    assert request["first_token"] >= request["first_scheduled"] >= request["seen"]
    assert any(r["kind"] == "step" for r in records)



def test_trace_records_full_collections() -> None:
    import gc

    clock = ManualClock()
    out = io.StringIO()
    trace = StepTrace(out, clock)
    trace.watch_gc()
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(trace._on_gc)
    (record,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert record["kind"] == "gc" and record["generation"] == 2 and record["pause"] == 0.0


def test_heap_freeze_exempts_start_up_objects() -> None:
    import subprocess
    import sys

    code = ("import gc; from andante.runtime.gc_heap import freeze_heap; n = freeze_heap(); "
            "assert n > 1000 and gc.get_freeze_count() == n, n; print(n)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
