"""Property test: the scheduler's running sums (`WorkTotals`, exposed in the stats) equal
a recount over its requests after any schedule of adds, steps (with preemptions),
aborts (also of a batch in flight), withdrawals and simulator decode runs."""

from __future__ import annotations

from itertools import repeat

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import PreemptionMode
from andante.core.clock import ManualClock
from andante.engine.engine import Engine
from andante.engine.fast_path import SimFastPath
from andante.sim.decode_run import decode_run_limit, fit_blocks, reserve_blocks
from tests.engine.helpers import make_engine, make_request

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 24)),
        st.tuples(st.just("burst"), st.integers(2, 6), st.integers(1, 24)),
        st.tuples(st.just("step"), st.integers(1, 12), st.just(0)),
        st.tuples(st.just("abort"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("abort_in_flight"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("withdraw"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("decode_run"), st.integers(2, 6), st.just(0)),
    ),
    min_size=8,
    max_size=50,
)


def _check(engine: Engine) -> None:
    reqs = list(engine.scheduler.requests.values())
    stats = engine.stats()
    assert stats.num_requests == len(reqs)
    assert stats.num_prefilling == sum(1 for r in reqs if not r.output_token_ids)
    assert stats.num_tokens == sum(r.num_tokens for r in reqs)
    assert stats.num_uncomputed_tokens == sum(r.num_uncomputed_tokens for r in reqs)
    assert stats.num_output_tokens == sum(r.num_output_tokens for r in reqs)
    assert stats.num_remaining_output_tokens == sum(
        r.num_remaining_output_tokens for r in reqs)


def _step(engine: Engine, clock: ManualClock, abort_index: int | None = None) -> None:
    batch, result = engine.begin_step()
    if abort_index is not None and batch.requests:
        engine.abort(batch.requests[abort_index % len(batch.requests)].request_id)
    clock.advance_to(clock.now() + result.duration)
    engine.finish_step(batch, result)
    _check(engine)


def _decode_run(engine: Engine, clock: ManualClock, num_steps: int) -> None:
    batch, result = engine.begin_step()
    clock.advance_to(clock.now() + result.duration)
    engine.finish_step(batch, result)
    sched = engine.scheduler
    fast = sched.policy
    assert isinstance(fast, SimFastPath)
    k = fit_blocks(sched, batch, min(num_steps, decode_run_limit(sched, fast, batch)),
                   fast.decode_run_reserve_blocks)
    if k:
        reserve_blocks(sched, batch, k)
        times = [clock.now() + 0.01 * (i + 1) for i in range(k)]
        sched.record_tokens(batch.requests, repeat(k), repeat(7), *times)
        clock.advance_to(times[-1])


def _pick(engine: Engine, index: int) -> str | None:
    ids = sorted(engine.scheduler.requests)
    return ids[index % len(ids)] if ids else None


@settings(max_examples=150, deadline=None)
@given(ops=OPS, policy=st.sampled_from(["vllm", "vllm-v0", "fastserve", "sarathi"]),
       num_blocks=st.integers(9, 20), swap=st.booleans())
def test_totals_equal_a_recount(ops: list[tuple[str, int, int]], policy: str,
                                num_blocks: int, swap: bool) -> None:
    mode = PreemptionMode.SWAP if swap else PreemptionMode.RECOMPUTE
    engine, _, clock = make_engine(policy, num_blocks, num_host_blocks=12,
                                   preemption_mode=mode, max_model_len=64)
    for i, (op, a, b) in enumerate(ops):
        if op == "add":
            engine.submit(make_request(f"r{i}", a, b, arrival=clock.now()))
        elif op == "burst":
            for j in range(a):
                engine.submit(make_request(f"r{i}.{j}", 4 + 5 * j, b, arrival=clock.now()))
        elif op == "step":
            for _ in range(a):
                _step(engine, clock)
        elif op == "abort_in_flight":
            _step(engine, clock, abort_index=a)
        elif op == "decode_run":
            _decode_run(engine, clock, a)
        elif (rid := _pick(engine, a)) is not None:
            if op == "abort":
                engine.abort(rid)
            else:
                engine.scheduler.withdraw(rid)
        _check(engine)
