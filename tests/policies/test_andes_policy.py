"""The `andes` policy on the real scheduler: triggering, refiner, pacer, what each option
variant changes, invariants."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import ManualClock, PreemptionMode, Request, RequestStatus
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.llm import build_engine
from andante.policies import SchedulerConfig, policy_names
from andante.policies.andes import AndesOptions, AndesPolicy
from tests.engine.helpers import FakeExecutor, make_request, run_to_completion


@dataclass
class Costs:
    """A cost model stub. The default's prefills are slow: admissions stall everybody."""

    prefill_per_token: float = 0.05
    prefill_fixed: float = 0.5
    decode: Callable[[int], float] = lambda batch_size: 0.01 + 0.0001 * batch_size
    swap_per_token: float = 1e-5

    def prefill_time(self, num_tokens: int, num_cached: int = 0) -> float:
        return self.prefill_fixed + self.prefill_per_token * num_tokens if num_tokens else 0.0

    def decode_time(self, batch_size: int, context_len: int) -> float:
        return self.decode(batch_size)

    def swap_time(self, num_tokens: int) -> float:
        return self.swap_per_token * num_tokens


def _engine(num_blocks: int, options: dict[str, Any], costs: Any = None,
            num_host_blocks: int = 0, max_num_seqs: int = 256,
            ) -> tuple[Engine, FakeExecutor, ManualClock]:
    clock = ManualClock()
    executor = FakeExecutor(num_blocks, num_host_blocks)
    executor.cost_model = costs
    config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=256,
                             max_num_batched_tokens=256, max_num_seqs=max_num_seqs)
    options = {"chunked_prefill": False, **options}  # the paper's prefill-first steps
    return build_engine(executor, clock, "andes", config, options), executor, clock


def _policy(engine: Engine) -> AndesPolicy:
    policy = engine.scheduler.policy
    assert isinstance(policy, AndesPolicy)
    return policy


def _step(engine: Engine, clock: ManualClock, dt: float | None = None) -> None:
    batch, result = engine.begin_step()
    clock.advance_to(clock.now() + (result.duration if dt is None else dt))
    engine.finish_step(batch, result)


def test_registered_with_options() -> None:
    assert {"andes", "lqsf"} <= set(policy_names())
    with pytest.raises(ValueError, match="unknown option"):
        _engine(16, {"horizon": 3})
    for bad in ({"delta_t": 0}, {"solver": "ilp"}, {"objective": "p99"}, {"watermark": 2}):
        with pytest.raises(ValueError):
            AndesOptions(**bad)  # type: ignore[arg-type]


def test_selective_triggering_waits_for_memory_pressure() -> None:
    engine, _, clock = _engine(100, {"solver_interval": 1, "watermark": 0.9})
    engine.add_request(make_request("a", 40, 30, slo=SLO(ttft=1.0, tds=5.0)))
    engine.add_request(make_request("b", 40, 30, slo=SLO(ttft=1.0, tds=5.0)))
    for _ in range(5):
        _step(engine, clock)
    assert _policy(engine).stats.num_solves == 0  # 20 % of the blocks in use
    for i in range(6):
        engine.add_request(make_request(f"c{i}", 60, 30, arrival=clock.now()))
    for _ in range(5):
        _step(engine, clock)
    assert _policy(engine).stats.num_solves > 0  # memory full, requests queued


def test_compute_bound_trigger() -> None:
    """Token latency above the most stringent reader's pace triggers the solver."""
    engine, executor, clock = _engine(1000, {"solver_interval": 1})
    for i in range(3):
        engine.add_request(make_request(f"r{i}", 8, 50, slo=SLO(ttft=1.0, tds=20.0)))
    for _ in range(3):
        _step(engine, clock)
    assert _policy(engine).stats.num_solves == 0
    executor.step_time = 0.2  # 0.2 s per token, the readers want one every 0.05 s
    for _ in range(20):
        _step(engine, clock)
    assert _policy(engine).stats.num_solves > 0


def _crowded(refiner: bool) -> tuple[Engine, ManualClock, list[Request]]:
    """Memory full of young, fast-reading streams; a fresh short request arrives and
    admitting it means recomputing a long stream on slow hardware."""
    options = {"solver_interval": 1, "watermark": 0.5, "refiner": refiner,
               "slack_percentile": 1.0, "pacer_aware": False}
    engine, _, clock = _engine(72, options, Costs())
    running = [make_request(f"run{i}", 60, 200, slo=SLO(ttft=1.0, tds=40.0))
               for i in range(4)]
    for req in running:
        engine.add_request(req)
    for _ in range(8):
        _step(engine, clock)
    assert engine.scheduler.num_running == 4
    engine.add_request(make_request("new", 20, 5, arrival=clock.now(), slo=SLO(ttft=1.0, tds=4.0)))
    for _ in range(3):
        _step(engine, clock, dt=0.02)
    return engine, clock, running


def test_refiner_rejects_an_admission_whose_overhead_costs_more_than_it_gains() -> None:
    """The refiner's case: it cancels the preemption the knapsack chose; without the
    refiner the same admission preempts a running stream."""
    engine, _, running = _crowded(refiner=True)
    assert _policy(engine).stats.num_solves > 0
    assert not any(r.timeline.preemption_times for r in running)
    assert engine.scheduler.num_waiting == 1
    engine, _, running = _crowded(refiner=False)
    assert any(r.timeline.preemption_times for r in running)


def test_pacer_saturated_reader_makes_room_for_a_queued_request() -> None:
    options = {"solver_interval": 10**6, "delta_t": 5.0}
    engine, _, clock = _engine(12, options, num_host_blocks=64)
    reader = make_request("reader", 30, 100, slo=SLO(ttft=1.0, tds=1.0))
    engine.add_request(reader)
    for _ in range(12):  # 12 tokens in 0.12 s: 12 s of reading at 1 token/s
        _step(engine, clock, dt=0.01)
    queued = make_request("queued", 20, 4, arrival=clock.now(), slo=SLO(ttft=1.0, tds=5.0))
    engine.add_request(queued)
    _step(engine, clock, dt=0.01)
    assert reader.timeline.preemption_times and queued.timeline.first_scheduled_time is not None
    assert reader.timeline.num_swaps_out == 1  # swap beats recomputing 42 tokens
    run_to_completion(engine, clock)


# ---- each variant changes the decision on a case built for it ----------------------
Decision = tuple[list[str], dict[str, str]]  # ids scheduled; preempted id -> status
SOLVE_EVERY_STEP = {"solver_interval": 1, "watermark": 0.0}


def _decide(engine: Engine, clock: ManualClock, reqs: list[Request]) -> Decision:
    batch, _ = engine.begin_step()
    held = (RequestStatus.PREEMPTED, RequestStatus.SWAPPED)
    return (sorted(r.request_id for r in batch.requests),
            {r.request_id: r.status.name for r in reqs if r.status in held})


def _add(engine: Engine, reqs: list[Request], *args: Any, **kwargs: Any) -> None:
    reqs.append(make_request(*args, **kwargs))
    engine.add_request(reqs[-1])


def _one_stream(options: dict[str, Any], num_blocks: int, costs: Any = None,
                num_running: int = 1) -> tuple[Engine, ManualClock, list[Request]]:
    """`num_running` streams read on pace (5 tokens/s) for three steps."""
    engine, _, clock = _engine(num_blocks, {**SOLVE_EVERY_STEP, **options}, costs)
    reqs: list[Request] = []
    for i in range(num_running):
        _add(engine, reqs, f"R{i}", 4, 100, slo=SLO(ttft=1.0, tds=5.0))
    for _ in range(3):
        _step(engine, clock, dt=0.2)
    return engine, clock, reqs


def _two_small_beat_one_big(options: dict[str, Any]) -> Decision:
    """10 free blocks: A (6 blocks, gain 1) has the best gain per block, but the late B
    and C (5 blocks each, gain 0.76) gain more together. Algorithm 1 takes A and stops
    at B; the DP takes B and C."""
    engine, clock, reqs = _one_stream(options, 12)
    now = clock.now()
    _add(engine, reqs, "A", 20, 10, arrival=now, slo=SLO(ttft=1.0, tds=5.0))
    for rid in ("B", "C"):
        _add(engine, reqs, rid, 16, 10, arrival=now - 2.0, slo=SLO(ttft=0.5, tds=5.0))
    return _decide(engine, clock, reqs)


def _fast_reader_against_a_bigger_one(options: dict[str, Any]) -> Decision:
    """One sequence slot. Served at 0.02 s per token, a 200 tokens/s reader cannot get
    a perfect QoE (gain 0.4 over 2 blocks), a 2 tokens/s reader can (gain 1 over 3
    blocks): "avg" admits the latter. Nobody's QoE is below 1 yet, so "min" values
    both at 1 and admits the smaller one."""
    engine, _, clock = _engine(16, options, max_num_seqs=1)
    reqs: list[Request] = []
    _add(engine, reqs, "fast", 4, 10, slo=SLO(ttft=1.0, tds=200.0))
    _add(engine, reqs, "slow", 8, 10, slo=SLO(ttft=1.0, tds=2.0))
    return _decide(engine, clock, reqs)


def _late_small_against_fresh_big(options: dict[str, Any]) -> Decision:
    """6 free blocks: L (2 blocks) is past its TTFT target, its QoE can no longer be 1
    but it still gains most per block; F (5 blocks) is fresh. Only one fits first: "avg"
    admits L, "perfect" F (L's gain is 0 for it)."""
    engine, clock, reqs = _one_stream(options, 8)
    _add(engine, reqs, "L", 4, 10, arrival=0.0, slo=SLO(ttft=0.5, tds=5.0))
    _add(engine, reqs, "F", 16, 10, arrival=clock.now(), slo=SLO(ttft=1.0, tds=5.0))
    return _decide(engine, clock, reqs)


def _pacer_full_reader_with_costly_swaps(options: dict[str, Any]) -> Decision:
    """A reader holding 12 s of text makes room for a queued request; swapping its KV
    out and back costs more than recomputing it, so "auto" recomputes."""
    costs = Costs(prefill_per_token=1e-5, prefill_fixed=0.0, swap_per_token=1e-2)
    engine, _, clock = _engine(12, {"delta_t": 5.0, **options}, costs, num_host_blocks=64)
    reqs: list[Request] = []
    _add(engine, reqs, "reader", 30, 100, slo=SLO(ttft=1.0, tds=1.0))
    for _ in range(12):
        _step(engine, clock, dt=0.01)
    _add(engine, reqs, "queued", 20, 4, arrival=clock.now(), slo=SLO(ttft=1.0, tds=5.0))
    return _decide(engine, clock, reqs)


def _slow_beyond_two(options: dict[str, Any]) -> Decision:
    """A step takes 0.1 s for up to 2 requests, 1 s beyond: memory holds the running
    stream and three fresh requests, but only B = 2 keeps up with the readers, so the
    batch-size search admits two (B_max would admit all three)."""
    costs = Costs(prefill_per_token=1e-4, prefill_fixed=0.0,
                  decode=lambda batch_size: 0.1 if batch_size <= 2 else 1.0)
    engine, clock, reqs = _one_stream({"latency_ema": 1e-6, **options}, 64, costs)
    for i in range(3):
        _add(engine, reqs, f"W{i}", 4, 10, arrival=clock.now(), slo=SLO(ttft=1.0, tds=5.0))
    return _decide(engine, clock, reqs)


@pytest.mark.parametrize(("variant", "case", "default", "changed"), [
    ({"solver": "dp"}, _two_small_beat_one_big, (["A"], {}), (["B", "C"], {})),
    ({"objective": "min"}, _fast_reader_against_a_bigger_one, (["slow"], {}), (["fast"], {})),
    ({"objective": "perfect"}, _late_small_against_fresh_big, (["L"], {}), (["F"], {})),
    ({"preemption": "swap"}, _pacer_full_reader_with_costly_swaps,
     (["queued"], {"reader": "PREEMPTED"}), (["queued"], {"reader": "SWAPPED"})),
    ({"batch_search": False}, _slow_beyond_two, (["W0", "W1"], {}), (["W0", "W1", "W2"], {})),
], ids=["dp", "min", "perfect", "swap", "no-batch-search"])
def test_each_variant_changes_the_decision_on_its_case(
    variant: dict[str, Any], case: Callable[[dict[str, Any]], Decision], default: Decision,
    changed: Decision,
) -> None:
    """(The refiner's case is `_crowded`, tested above.)"""
    assert case({}) == default
    assert case(variant) == changed


WORKLOAD = st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20), st.integers(0, 5),
                              st.sampled_from([1.0, 3.3, 4.8, 20.0])),
                    min_size=1, max_size=12)
VARIANTS = st.sampled_from([{}, {"solver": "dp"}, {"objective": "min"}, {"objective": "perfect"},
                            {"refiner": False}, {"preemption": "swap"}, {"batch_search": False}])


@settings(max_examples=60, deadline=None)
@given(workload=WORKLOAD, num_blocks=st.integers(9, 40), swap=st.booleans(),
       lqsf=st.booleans(), variant=VARIANTS)
def test_everything_finishes_and_blocks_return(
    workload: list[tuple[int, int, int, float]], num_blocks: int, swap: bool, lqsf: bool,
    variant: dict[str, Any],
) -> None:
    """KV conservation and liveness for andes and lqsf in every variant."""
    clock = ManualClock()
    mode = PreemptionMode.SWAP if swap else PreemptionMode.RECOMPUTE
    config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=64,
                             max_num_batched_tokens=64, preemption_mode=mode)
    engine = build_engine(FakeExecutor(num_blocks, 16), clock, "lqsf" if lqsf else "andes",
                          config, {"solver_interval": 1, "watermark": 0.2, **variant})
    reqs = [make_request(f"r{i}", p, o, arrival=step * 0.01, slo=SLO(ttft=0.2, tds=tds))
            for i, (p, o, step, tds) in enumerate(workload)]
    for req in reqs:
        engine.add_request(req)
    run_to_completion(engine, clock)
    kv = engine.scheduler.kv
    assert kv.num_free_device_blocks == num_blocks and kv.num_free_host_blocks == 16
    for req in reqs:
        assert req.is_finished
        capped = kv.num_blocks_for(req.num_tokens + 1) > num_blocks
        assert req.num_output_tokens == req.sampling.max_tokens or capped
