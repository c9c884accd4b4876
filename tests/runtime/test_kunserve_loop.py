"""A KunServe group leader's engine loop (andante.runtime.kunserve_loop): steps overlap
in the group's pipeline; an abort while a request's microbatch is in flight frees its
blocks at once and reports it finished once; a drain empties the pipeline; after
`stop` the loop steps the engine as `Engine.step` does. Greedy outputs stay the
unsplit model's (float32)."""

from __future__ import annotations

from typing import Any

import pytest

from andante.cluster.kunserve.lookahead import (
    balanced_slot_config,
    queued_work,
    slot_config,
    stage_cost_model,
)
from andante.core import ManualClock, Request, SamplingParams
from andante.engine.engine import Engine, StepOutput
from andante.exec.batch import StepBatch
from andante.exec.torch_pipeline import PipelineExecutor, PipelineStage
from andante.llm import build_engine
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.policies import SchedulerConfig
from andante.runtime.kunserve_loop import GroupLoop
from andante.runtime.worker import InstanceWorker
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint

PROMPTS = [list(range(10, 40)), [5, 17, 33, 200, 12], list(range(100, 141)), [7, 7, 7, 9],
           list(range(3, 60))]
NUM_TOKENS = 16
CONFIG = SchedulerConfig(max_model_len=512, max_num_batched_tokens=32, max_num_seqs=4)


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4l"), num_hidden_layers=4)
    return load_model(path, "float32")


def _pipeline(model: LoadedModel) -> PipelineExecutor:
    unsplit = tiny_executor(model)
    stages = [PipelineStage(model, unsplit.options, s, 64, 64, unsplit.max_model_len)
              for s in [(0, 2), (2, 4)]]
    return PipelineExecutor(model, unsplit.options, stages, unsplit.cost_model,
                            unsplit.max_model_len, pipelined=True)


def _requests() -> list[Request]:
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    return [Request(f"r{i}", p, params, 0.0) for i, p in enumerate(PROMPTS)]


def _engine_on_loop(tiny4: Any) -> tuple[Engine, GroupLoop]:
    """An engine over a two-stage pipeline of `tiny4`, stepped by a group loop."""
    pipeline = _pipeline(tiny4)
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    loop = GroupLoop(engine)
    loop.run_on(pipeline)
    return engine, loop


def _finished(outputs: list[StepOutput]) -> list[str]:
    return [r.request_id for o in outputs for r in o.finished]


def test_abort_mid_flight_frees_its_blocks_and_others_are_unchanged(tiny4) -> None:  # type: ignore[no-untyped-def]
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS)
    engine, loop = _engine_on_loop(tiny4)
    requests = _requests()
    for req in requests:
        engine.add_request(req)
    scheduler, kv = engine.scheduler, engine.scheduler.kv
    outputs: list[StepOutput] = []
    victim = requests[2]
    while not (victim.num_output_tokens >= 3 and victim.request_id in
               scheduler._in_flight_ids):  # its microbatch is in the pipeline now
        out, ran = loop.step_output()
        assert ran
        outputs += [out] if out is not None else []
    free_before, held = kv.num_free_device_blocks, len(kv.block_table(victim.request_id))
    assert held > 0
    engine.abort(victim.request_id)
    assert not kv.holds_kv(victim.request_id)
    assert kv.num_free_device_blocks == free_before + held  # freed mid-flight
    tokens_at_abort = list(victim.output_token_ids)
    while loop.has_work:
        out, _ = loop.step_output()
        outputs += [out] if out is not None else []
    loop.stop()
    assert _finished(outputs).count(victim.request_id) == 1
    assert sorted(_finished(outputs)) == sorted(r.request_id for r in requests)
    assert victim.output_token_ids == tokens_at_abort  # its in-flight row was dropped
    assert victim.output_token_ids == reference[2].output_token_ids[:len(tokens_at_abort)]
    others = [r for r in requests if r is not victim]
    assert [r.output_token_ids for r in others] == \
        [r.output_token_ids for r in reference if r.request_id != victim.request_id]
    assert loop.num_overlapped > 0
    kv.check_invariants()
    assert kv.num_free_device_blocks == kv.num_device_blocks


def test_drain_empties_the_pipeline_and_stop_returns_to_whole_steps(tiny4) -> None:  # type: ignore[no-untyped-def]
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS)
    engine, loop = _engine_on_loop(tiny4)
    requests = _requests()
    for req in requests:
        engine.add_request(req)
    outputs: list[StepOutput] = []
    while not engine.scheduler.has_in_flight:
        out, _ = loop.step_output()
        outputs += [out] if out is not None else []
    loop.drain()  # a group operation would run now
    assert not engine.scheduler.has_in_flight and loop.overlapped is not None
    assert loop.overlapped.in_flight == 0 and loop.has_work
    loop.stop()
    assert loop.overlapped is None
    while loop.has_work:  # the drained outputs first, then whole steps
        out, _ = loop.step_output()
        assert out is not None
        outputs.append(out)
    assert sorted(_finished(outputs)) == sorted(r.request_id for r in requests)
    assert [r.output_token_ids for r in requests] == [r.output_token_ids for r in reference]


def test_a_request_aborted_while_nothing_is_in_flight_is_reported_once(tiny4) -> None:  # type: ignore[no-untyped-def]
    pipeline = _pipeline(tiny4)
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    loop = GroupLoop(engine)
    loop.run_on(pipeline)
    try:
        waiting = _requests()[0]
        engine.add_request(waiting)
        engine.abort(waiting.request_id)  # before any step: the pipeline is empty
        refused = Request("huge", list(range(10_000)), waiting.sampling, 0.0)
        assert not engine.submit(refused)  # can never be served
        reported: list[str] = []
        for _ in range(5):
            out, ran = loop.step_output()
            assert not ran
            reported += _finished([out]) if out is not None else []
        assert sorted(reported) == ["huge", waiting.request_id]
        assert not loop.has_work  # the leader's worker does not spin
    finally:
        pipeline.close()


def test_a_boundary_operation_finds_the_pipeline_drained(tiny4) -> None:  # type: ignore[no-untyped-def]
    """A client gone mid-microbatch: its request is aborted with its microbatch still in
    the pipeline; a sleep posted then (andante.server.sleep) must not find it in flight."""
    pipeline = _pipeline(tiny4)
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    worker = InstanceWorker(0, engine)
    worker.loop = loop = GroupLoop(engine)
    loop.run_on(pipeline)
    requests = _requests()
    try:
        for req in requests:
            worker.submit(req)
        finished: list[str] = []
        while not engine.scheduler.has_in_flight:
            message = worker.step()
            finished += message.finished_ids if message is not None else []
        for req in requests:
            worker.abort(req.request_id)
        slept: list[int | None] = []
        worker.at_boundary(lambda w: (pipeline.sleep(1), slept.append(pipeline.sleeping)))
        while (message := worker.step()) is not None:
            finished += message.finished_ids
        assert slept == [1]
        assert sorted(finished) == sorted(r.request_id for r in requests)
        assert not worker.loop.has_work
        pipeline.wake_up()
    finally:
        pipeline.close()


def test_a_step_beside_microbatches_in_flight_takes_lookaheads_balanced_budget(tiny4) -> None:  # type: ignore[no-untyped-def]
    """A burst of long prompts reaches a group decoding short requests: each step formed
    beside a microbatch in flight takes the token count lookahead's `balanced_slot_config`
    (the simulator's decision) gives, not the slot's whole budget; outputs unchanged."""
    config = SchedulerConfig(max_model_len=512, max_num_batched_tokens=96, max_num_seqs=8)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    short = [list(range(10 + i, 20 + i)) for i in range(3)]
    long = [[(7 * j + i) % 250 + 3 for j in range(200)] for i in range(3)]
    reference, _ = run_engine(tiny_executor(tiny4), short + long, 12)
    pipeline = _pipeline(tiny4)
    engine = build_engine(pipeline, ManualClock(), "vllm", config)
    loop = GroupLoop(engine)
    loop.run_on(pipeline)
    stage_cost = stage_cost_model(pipeline.cost_model, [(0, 2), (2, 4)])
    schedule, checked = engine.schedule_step, []

    def schedule_and_check() -> StepBatch:
        assert loop.overlapped is not None
        in_flight = loop.overlapped.in_flight
        slot = slot_config(config, 2, in_flight)
        decodes, queued = queued_work(engine.scheduler.running, engine.scheduler.waiting,
                                      pipeline.in_flight_ids())
        recent = [stage_cost.step_time(s) for s in pipeline.recent_shapes]
        expected = balanced_slot_config(slot, stage_cost, decodes, queued, recent)
        batch = schedule()
        if in_flight and queued > slot.max_num_batched_tokens - len(decodes):
            assert batch.num_tokens == expected.max_num_batched_tokens
            checked.append(expected.max_num_batched_tokens)
        return batch

    engine.schedule_step = schedule_and_check  # type: ignore[method-assign]
    requests = [Request(f"r{i}", p, params, 0.0) for i, p in enumerate(short + long)]
    try:
        for req in requests[:3]:
            engine.add_request(req)
        for _ in range(12):  # the short ones decode, a microbatch in flight
            loop.step_output()
        for req in requests[3:]:  # the burst
            engine.add_request(req)
        while loop.has_work:
            loop.step_output()
    finally:
        loop.stop()
    assert len([b for b in checked if b < config.max_num_batched_tokens]) >= 3
    assert [r.output_token_ids for r in requests] == [r.output_token_ids for r in reference]
