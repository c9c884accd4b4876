"""The `andes` policy on the real scheduler: triggering, refiner, pacer, invariants."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import ManualClock, PreemptionMode, Request
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.llm import build_engine
from andante.policies import SchedulerConfig, policy_names
from andante.policies.andes import AndesOptions, AndesPolicy
from tests.engine.helpers import FakeExecutor, make_request, run_to_completion


class SlowCosts:
    """A cost model stub whose prefills are slow: admissions stall everybody."""

    def __init__(self, prefill_per_token: float = 0.05, prefill_fixed: float = 0.5) -> None:
        self.per_token, self.fixed = prefill_per_token, prefill_fixed

    def prefill_time(self, num_tokens: int, num_cached: int = 0) -> float:
        return self.fixed + self.per_token * num_tokens if num_tokens else 0.0

    def decode_time(self, batch_size: int, context_len: int) -> float:
        return 0.01 + 0.0001 * batch_size

    def swap_time(self, num_tokens: int) -> float:
        return 1e-5 * num_tokens


def _engine(num_blocks: int, options: dict[str, Any], costs: Any = None,
            num_host_blocks: int = 0) -> tuple[Engine, FakeExecutor, ManualClock]:
    clock = ManualClock()
    executor = FakeExecutor(num_blocks, num_host_blocks)
    executor.cost_model = costs
    config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=256,
                             max_num_batched_tokens=256)
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
    engine, _, clock = _engine(72, options, SlowCosts())
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
    engine, _, running = _crowded(refiner=True)
    policy = _policy(engine)
    assert policy.stats.num_solves > 0 and policy.stats.num_pairs_cancelled > 0
    assert sum(r.timeline.num_recomputes for r in running) == 0
    assert engine.scheduler.num_waiting == 1


def test_without_refiner_the_same_admission_preempts() -> None:
    engine, _, running = _crowded(refiner=False)
    assert sum(len(r.timeline.preemption_times) for r in running) >= 1


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


@pytest.mark.parametrize("options", [{}, {"solver": "dp"}, {"objective": "min"},
                                     {"objective": "perfect"}, {"refiner": False},
                                     {"preemption": "swap"}, {"batch_search": False}])
def test_variants_finish_everything(options: dict[str, Any]) -> None:
    options = {"solver_interval": 1, "watermark": 0.3, **options}
    engine, _, clock = _engine(24, options, num_host_blocks=16)
    reqs = [make_request(f"r{i}", 4 + 3 * (i % 5), 6 + i % 7, arrival=0.01 * i,
                         slo=SLO(ttft=0.5, tds=2.0 + i % 4)) for i in range(14)]
    for req in reqs:
        engine.add_request(req)
    run_to_completion(engine, clock)
    assert all(r.is_finished for r in reqs)


WORKLOAD = st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20), st.integers(0, 5),
                              st.sampled_from([1.0, 3.3, 4.8, 20.0])),
                    min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(workload=WORKLOAD, num_blocks=st.integers(9, 40), swap=st.booleans(),
       lqsf=st.booleans())
def test_everything_finishes_and_blocks_return(
    workload: list[tuple[int, int, int, float]], num_blocks: int, swap: bool, lqsf: bool
) -> None:
    clock = ManualClock()
    mode = PreemptionMode.SWAP if swap else PreemptionMode.RECOMPUTE
    config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=64,
                             max_num_batched_tokens=64, preemption_mode=mode)
    engine = build_engine(FakeExecutor(num_blocks, 16), clock, "lqsf" if lqsf else "andes",
                          config, {"solver_interval": 1, "watermark": 0.2})
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
