"""Ascendra's LP instance: out-of-order batching (Algorithm 1) and offload (§5.3)."""

from __future__ import annotations

import math

import pytest

from andante.core.request import PrefixIds, Request
from andante.policies.ascendra import AscendraLPPolicy, value_function
from andante.policies.ascendra.options import LPOptions
from tests.policies.ascendra_helpers import engine, request, step


def test_value_functions() -> None:
    req = request("a", 1000, arrival=0.0, ttft=1.0)
    edf = value_function("edf")
    assert edf(req, 0.5, 0.25, 1.0) == pytest.approx(4.0)  # 1 / (1 - (0.5 + 0.25))
    assert edf(req, 0.8, 0.25, 1.0) == math.inf  # it can no longer make it
    assert value_function("sjf")(req, 0.0, 0.5, 1.0) > value_function("sjf")(req, 0.0, 1.0, 1.0)
    assert value_function("ljf")(req, 0.0, 1.0, 1.0) == 1.0
    assert value_function("fcfs")(req, 2.0, 0.1, 1.0) == 2.0
    with pytest.raises(ValueError, match="value function"):
        LPOptions(value="random")


def test_offload_decision_follows_wait_plus_prefill_plus_full_batch() -> None:
    eng, clock = engine("ascendra-lp", {"hp_batch_tokens": 2048})
    policy = eng.scheduler.policy
    assert isinstance(policy, AscendraLPPolicy)
    req = request("a", 2048, arrival=0.0, ttft=1.0)
    margin = policy.prefill_time(req) + policy.full_batch_time()  # ~0.19 + ~0.19 s
    assert 0.3 < margin < 0.5
    assert not policy.at_risk(req, now=0.99 - margin)
    assert policy.at_risk(req, now=1.01 - margin)
    no_slo = request("b", 2048, ttft=None)  # falls back to the option (1 s)
    assert policy.at_risk(no_slo, now=1.01 - margin)


def test_unscheduled_at_risk_requests_are_handed_off_once() -> None:
    eng, clock = engine("ascendra-lp", {"token_budget": 2048, "chunk": False})
    for i in range(6):  # 6 x 2,000 tokens: only one fits a step's token budget
        eng.add_request(request(f"r{i}", 2000, arrival=0.0))
    clock.advance_to(0.7)  # 0.7 + 0.19 + 0.19 > 1 s for everyone waiting
    batch, _ = eng.begin_step()
    policy = eng.scheduler.policy
    handed = policy.take_handoffs()
    scheduled = {r.request_id for r in batch.requests}
    assert len(scheduled) == 1 and set(handed) == {f"r{i}" for i in range(6)} - scheduled
    assert policy.take_handoffs() == []
    taken = [eng.scheduler.withdraw(rid) for rid in handed]
    assert all(r is not None and r.request_id not in eng.scheduler.requests for r in taken)
    eng.add_request(taken[0])  # came back (nowhere else to go): never offloaded again
    eng.begin_step()
    assert taken[0].request_id not in policy.take_handoffs()


def test_offload_does_not_depend_on_computed_tokens_from_the_prefix_cache() -> None:
    eng, clock = engine("ascendra-lp", {"token_budget": 2048, "chunk": False})
    system = PrefixIds(tuple(range(64)), 16, 1024)  # a shared 1,024-token system prompt

    def with_system(rid: str, arrival: float) -> Request:
        req = request(rid, 2000, arrival=arrival)
        req.prefix_ids = system
        return req

    eng.add_request(with_system("seed", 0.0))
    while eng.has_work:  # its blocks are cached when it finishes
        step(eng, clock)
    start = clock.now()
    for i in range(6):
        eng.add_request(with_system(f"r{i}", start))
    clock.advance_to(start + 0.7)
    batch, _ = eng.begin_step()
    waiting = [r for r in eng.scheduler.waiting if r.request_id.startswith("r")]
    assert waiting and all(r.num_computed_tokens == 1024 for r in waiting)  # prefix hits
    handed = eng.scheduler.policy.take_handoffs()
    scheduled = {r.request_id for r in batch.requests}
    assert set(handed) == {f"r{i}" for i in range(6)} - scheduled  # before: none


def test_edf_packs_the_most_urgent_prefill_first() -> None:
    eng, clock = engine("ascendra-lp", {"token_budget": 1100, "offload": False, "chunk": False})
    eng.add_request(request("relaxed", 1000, arrival=0.0, ttft=5.0))
    eng.add_request(request("urgent", 1000, arrival=0.1, ttft=1.0))
    batch, _ = eng.begin_step()
    assert [r.request_id for r in batch.requests] == ["urgent"]  # the other waits (N)


def test_decodes_run_first_and_prefills_fit_the_step_budget() -> None:
    eng, clock = engine("ascendra-lp", {"offload": False, "step_budget": 0.05})
    for i in range(8):
        eng.add_request(request(f"d{i}", 200, max_tokens=64))
    step(eng, clock)  # their prefills (no decode yet: no time budget)
    eng.add_request(request("long", 6000, arrival=clock.now(), ttft=10.0))
    batch, result = eng.begin_step()
    ids = [r.request_id for r in batch.requests]
    assert ids[:8] == [f"d{i}" for i in range(8)] and ids[-1] == "long"
    assert batch.num_new_tokens[-1] < 6000  # a chunk...
    assert result.duration <= 0.05 + 1e-9  # ...that keeps the decodes' step short
