"""Andes with chunked prefill: its decisions carried out as vLLM-v1 steps (issue 14
item 6), and requests that waited past their TTFT target no longer starved by gain order
or by the refiner (issue 15)."""

from __future__ import annotations

from typing import Any

import pytest

from andante.core import ManualClock
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.llm import build_engine
from andante.policies import SchedulerConfig
from andante.policies.andes import AndesPolicy
from andante.policies.lqsf import LQSFPolicy
from tests.engine.helpers import FakeExecutor, make_request
from tests.policies.test_andes_policy import Costs


def _engine(options: dict[str, Any], num_blocks: int = 200, budget: int = 256,
            costs: Any = None) -> tuple[Engine, FakeExecutor, ManualClock]:
    clock = ManualClock()
    executor = FakeExecutor(num_blocks)
    executor.cost_model = costs
    config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=256,
                             max_num_batched_tokens=budget, max_num_seqs=16)
    return build_engine(executor, clock, "andes", config, options), executor, clock


def _step(engine: Engine, clock: ManualClock) -> None:
    batch, result = engine.begin_step()
    clock.advance_to(clock.now() + result.duration)
    engine.finish_step(batch, result)


def _with_a_long_prompt_arriving(options: dict[str, Any]) -> FakeExecutor:
    engine, executor, clock = _engine(options)
    engine.add_request(make_request("stream", 8, 40))
    for _ in range(3):
        _step(engine, clock)
    engine.add_request(make_request("long", 200, 4, arrival=clock.now()))
    for _ in range(6):
        _step(engine, clock)
    return executor


def test_a_long_prompt_is_prefilled_in_chunks_beside_the_decodes() -> None:
    executor = _with_a_long_prompt_arriving({"chunk_tokens": 64})
    steps = executor.batches[3:7]
    for batch in steps:
        ids = [r.request_id for r in batch.requests]
        assert ids[0] == "stream" and batch.num_new_tokens[0] == 1  # never stalled
    chunks = [b.num_new_tokens[1] for b in steps]
    # 200 prompt tokens; budget: a token per running request (1, then 2) plus 64
    assert chunks == [64, 65, 65, 6]


def test_prefill_first_stalls_the_stream_for_the_whole_prompt() -> None:
    executor = _with_a_long_prompt_arriving({"chunked_prefill": False})
    prefill = executor.batches[3]
    assert [r.request_id for r in prefill.requests] == ["long"]
    assert prefill.num_new_tokens == [200]


def test_chunking_is_declared_per_instance() -> None:
    engine, _, _ = _engine({}, budget=64)  # a budget below max_model_len is fine
    assert isinstance(engine.scheduler.policy, AndesPolicy)
    assert engine.scheduler.policy.chunks_prefill
    with pytest.raises(ValueError, match="prefills whole prompts"):
        _engine({"chunked_prefill": False}, budget=64)
    assert not LQSFPolicy.chunks_prefill  # the paper's baseline stays prefill-first
    with pytest.raises(ValueError, match="chunk_tokens"):
        _engine({"chunk_tokens": -1})


def _late_arrival_waits(options: dict[str, Any]) -> int:
    """Steps a request that arrived 30 s ago (its QoE over Δt is lost, served or not:
    gain ~0) waits while fast readers stream and memory is free."""
    engine, _, clock = _engine(options, costs=Costs())
    for i in range(4):
        engine.add_request(make_request(f"run{i}", 60, 200, slo=SLO(ttft=1.0, tds=40.0)))
    for _ in range(6):
        _step(engine, clock)
    clock.advance_to(40.0)
    late = make_request("late", 40, 5, arrival=clock.now() - 30.0)
    engine.add_request(late)
    for waited in range(20):
        _step(engine, clock)
        if late.num_computed_tokens:
            return waited
    return 20


def test_a_late_request_skips_the_refiner() -> None:
    assert _late_arrival_waits({}) == 0  # past its TTFT target: starved, admitted now
    no_limit = {"starvation_limit": 1e9, "refine_admissions": True}
    assert _late_arrival_waits(no_limit) == 20  # the refiner weighs its ~0 gain: starves
    assert _late_arrival_waits({**no_limit, "refine_admissions": False}) == 0
    # chunked prefill (the default) keeps every admission that fits from the refiner
    assert _late_arrival_waits({"starvation_limit": 1e9}) == 0


def _queue_order_under_overload(options: dict[str, Any]) -> list[str]:
    """Memory for one request at a time: an old request (arrived 40 s ago, its QoE over
    Δt lost either way) and a fresh one queue behind a running stream."""
    engine, _, clock = _engine(options, num_blocks=25)
    engine.add_request(make_request("run", 60, 30))
    for _ in range(3):
        _step(engine, clock)
    clock.advance_to(50.0)
    engine.add_request(make_request("old", 60, 4, arrival=10.0))
    engine.add_request(make_request("fresh", 60, 4, arrival=50.0))
    order: list[str] = []
    for _ in range(200):
        _step(engine, clock)
        for rid in ("old", "fresh"):
            req = engine.scheduler.requests.get(rid)
            if rid not in order and (req is None or req.num_computed_tokens):
                order.append(rid)
        if len(order) == 2:
            break
    return order


def test_a_starved_request_goes_before_fresh_ones() -> None:
    assert _queue_order_under_overload({}) == ["old", "fresh"]  # waited past its target
    no_limit = {"starvation_limit": 1e9}
    assert _queue_order_under_overload(no_limit) == ["fresh", "old"]  # gain order
    with pytest.raises(ValueError, match="starvation_limit"):
        _engine({"starvation_limit": -1.0})
