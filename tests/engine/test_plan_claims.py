"""StepPlan claims: a batch picked before the evictions that make room for it."""

from __future__ import annotations

import pytest

from andante.core import PreemptionMode
from andante.engine.engine import Engine
from andante.engine.plan import StepPlan
from tests.engine.helpers import make_engine, make_request


def _plan(engine: Engine) -> StepPlan:
    s = engine.scheduler
    return StepPlan(s.kv, s.config, engine.clock.now(), s.waiting, s.running, s.swapped)


def test_claims_take_the_budgets_and_schedule_after_the_evictions() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=5, num_host_blocks=4, max_num_seqs=2,
                               max_num_batched_tokens=20, max_model_len=20)
    a, b = make_request("a", 8, 4), make_request("b", 8, 4)
    engine.add_request(a)
    engine.add_request(b)
    engine.step()  # 2 blocks each: one is left
    c = make_request("c", 8, 4)
    engine.add_request(c)
    plan = _plan(engine)
    plan.claim(c, 8)
    plan.claim(a, 1)
    assert (plan.token_budget, plan.seq_budget) == (11, 0) and not plan.can_claim(1)
    assert plan.is_claimed(c) and not plan.is_claimed(b)
    assert not plan.can_schedule(c, 8)  # no room yet: b must go first
    plan.preempt(b, PreemptionMode.SWAP)
    plan.schedule_claims()
    assert plan.scheduled == [c, a] and plan.num_scheduled_tokens == [8, 1]
    assert (plan.token_budget, plan.seq_budget) == (11, 0) and not plan.claimed


def test_a_claim_that_cannot_be_scheduled_lapses_and_returns_its_budget() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=5, max_num_batched_tokens=20,
                               max_model_len=20)
    a, b = make_request("a", 8, 4), make_request("b", 8, 4)
    engine.add_request(a)
    engine.add_request(b)
    engine.step()
    c = make_request("c", 8, 4)
    engine.add_request(c)
    plan = _plan(engine)
    plan.claim(a, 1)
    plan.claim(c, 8)  # nothing is evicted: a takes the last block, c does not fit
    plan.schedule_claims()
    assert plan.scheduled == [a] and plan.token_budget == 19 and plan.is_claimed(c)


def test_bad_claims_are_refused() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=8, max_num_batched_tokens=10,
                               max_model_len=10)
    a = make_request("a", 8, 4)
    engine.add_request(a)
    plan = _plan(engine)
    with pytest.raises(ValueError, match="11 tokens of 'a'"):
        plan.claim(a, 11)
    with pytest.raises(ValueError, match="0 tokens"):
        plan.claim(a, 0)
    plan.claim(a, 8)
    with pytest.raises(ValueError, match="'a'"):
        plan.claim(a, 1)
