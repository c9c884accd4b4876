"""LSOs 2-3: the agent's eviction or state swap for a new head group (QLM §5)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.qlm.eviction import RunningRequest, head_group_evictions, preemption_mode
from andante.cluster.qlm.groups import GroupKey, form_groups, length_bucket
from andante.cluster.qlm.router import QLMRouter
from andante.cluster.registry import make_router
from andante.cluster.router import QueueDecision
from andante.core.request import PreemptionMode
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.sim import ClusterSpec, simulate
from andante.sim.setup import with_router
from andante.workload.mixes import BATCH_DEADLINE_S, assign_deadlines
from andante.workload.spec import RequestSpec
from tests.cluster.qlm.helpers import request

MISTRAL = CostModel(get_model("mistral-7b"), get_hardware("a100-80g"))
VICUNA = CostModel(get_model("vicuna-13b"), get_hardware("a100-80g"))
URGENT = {"now": 0.0, "head_time_s": 12.0}  # a 10 s head that cannot wait at all


def _head(prompts: list[int], slo: float = 10.0):
    reqs = [request(f"h{i}", slo=slo, prompt=p) for i, p in enumerate(prompts)]
    return form_groups(reqs, avg_batch_size=64)[0]


def test_a_head_group_that_fits_evicts_nobody() -> None:
    running = (RunningRequest("r0", 100.0, 500),)
    out = head_group_evictions(_head([100, 100]), running, 1000, 4, 10, MISTRAL, 1e9, **URGENT)
    assert out.victims == ()


def test_latest_deadlines_go_first_and_only_those_due_after_the_head() -> None:
    running = (RunningRequest("early", 5.0, 800), RunningRequest("late", 300.0, 300),
               RunningRequest("later", 900.0, 300), RunningRequest("mid", 50.0, 300))
    out = head_group_evictions(_head([300, 290]), running, 0, 4, 0, MISTRAL, 1e9, **URGENT)
    assert [rid for rid, _ in out.victims] == ["later", "late"]
    assert out.freed_tokens == 600
    assert all(mode is PreemptionMode.SWAP for _, mode in out.victims)  # Mistral: swap


def test_modes_per_model_and_the_host_budget() -> None:
    running = (RunningRequest("a", 100.0, 1000), RunningRequest("b", 200.0, 1000))
    vicuna = head_group_evictions(_head([1500]), running, 0, 4, 0, VICUNA, 1e9, **URGENT)
    assert {mode for _, mode in vicuna.victims} == {PreemptionMode.RECOMPUTE}
    tight = head_group_evictions(_head([1500]), running, 0, 4, 0, MISTRAL, 1200, **URGENT)
    assert [m for _, m in tight.victims] == [PreemptionMode.SWAP, PreemptionMode.RECOMPUTE]
    off = head_group_evictions(_head([1500]), running, 0, 4, 0, MISTRAL, 1e9,
                               state_swap=False, **URGENT)
    assert {mode for _, mode in off.victims} == {PreemptionMode.RECOMPUTE}


def test_nothing_is_evicted_when_even_all_victims_would_not_make_room() -> None:
    running = (RunningRequest("a", 100.0, 50),)
    out = head_group_evictions(_head([4000]), running, 0, 4, 0, MISTRAL, 1e9, **URGENT)
    assert out.victims == ()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.integers(1, 2000)), max_size=8),
       st.lists(st.integers(1, 1500), min_size=1, max_size=4), st.integers(0, 3000))
def test_victims_are_due_after_the_head_and_make_room_minimally(running, prompts, spare):
    reqs = tuple(RunningRequest(f"r{i}", d, n) for i, (d, n) in enumerate(running))
    head = _head(prompts, slo=30.0)
    out = head_group_evictions(head, reqs, spare, 8, 0, MISTRAL, 1e9, **URGENT)
    by_id = {r.request_id: r for r in reqs}
    assert all(by_id[rid].deadline > head.deadline for rid, _ in out.victims)
    assert out.freed_tokens == sum(by_id[rid].num_kv_tokens for rid, _ in out.victims)
    if out.victims:  # without its last victim the room would have been short
        last = by_id[out.victims[-1][0]].num_kv_tokens
        later = sum(r.num_kv_tokens for r in reqs if r.deadline > head.deadline)
        assert spare + out.freed_tokens - last < min(sum(head.prompt_tokens), spare + later)


def test_the_agent_evicts_for_an_urgent_head_in_the_simulator() -> None:
    """Long batch requests fill the instance; urgent ones arrive: the agent evicts (or
    swaps out) batch requests for them, and they meet their deadline; without eviction
    (the ablation) they wait."""
    spec = with_router(ClusterSpec(model="mistral-7b", num_instances=1), "qlm")
    spec = dataclasses.replace(spec, scheduler=dataclasses.replace(
        spec.scheduler, max_num_seqs=8), overlap_swaps=True)
    batch = [RequestSpec(0.0, 1000, 1500) for _ in range(8)]
    urgent = [RequestSpec(2.0, 200, 50) for _ in range(4)]
    workload = assign_deadlines(batch, 0.0, seed=0) + assign_deadlines(
        urgent, 1.0, latency_deadline=8.0, seed=0)
    met = {}
    batch_key = GroupKey("mistral-7b", f"{BATCH_DEADLINE_S:g}s", length_bucket(1000))
    for evict in (True, False):
        router = make_router("qlm", {"evict": evict})
        assert isinstance(router, QLMRouter)
        for _ in range(16):  # it has learned that batch requests like these run long
            router.outputs.observe(batch_key, 1500)
        run = simulate(dataclasses.replace(spec, router_options={"evict": evict}), workload,
                       router=router)
        assert len(run.report.finished) == len(workload)
        met[evict] = sum(1 for r in run.report.finished if r.slo.deadline == 8.0
                         and r.timeline.finish_time - r.arrival_time <= 8.0)
        if evict:
            assert router.counters.num_evictions >= 1
            assert run.report.router_counters["head_evicted"] >= 1
            assert run.report.router_counters["num_evictions"] == router.counters.num_evictions
        else:
            assert router.counters.num_evictions == 0
    assert met[True] > met[False]


def test_queue_decision_carries_evictions() -> None:
    decision = QueueDecision(evictions=((0, "r1", PreemptionMode.SWAP),))
    assert decision.evictions[0][2] is PreemptionMode.SWAP
    with pytest.raises(AttributeError):
        decision.evictions = ()  # type: ignore[misc]


def test_engine_preemption_mode_is_per_request() -> None:
    assert preemption_mode(MISTRAL, 64) is PreemptionMode.SWAP


def test_a_head_that_can_wait_for_the_running_requests_evicts_nobody() -> None:
    """The running requests free their slots in 3 s by their own expected outputs: a
    head due in 10 s, done 2 s after it starts, waits; one due in 4 s does not."""
    running = tuple(RunningRequest(f"r{i}", 500.0, 400, remaining_s=3.0) for i in range(4))
    head = _head([300, 300], slo=10.0)
    calm = head_group_evictions(head, running, 0, 0, 0, MISTRAL, 1e9, now=0.0,
                                head_time_s=2.0)
    assert calm.victims == ()
    tight = head_group_evictions(_head([300, 300], slo=4.0), running, 0, 0, 0, MISTRAL,
                                 1e9, now=0.0, head_time_s=2.0)
    assert len(tight.victims) == 2


def test_no_churn_among_near_equal_deadlines() -> None:
    """A running request due just after the head would miss its own deadline if
    evicted for it (and become the next late head): it is spared; one with slack is
    evicted instead."""
    near = RunningRequest("near", 10.5, 400, remaining_s=5.0)
    slack = RunningRequest("slack", 60.0, 400, remaining_s=5.0)
    head = _head([300], slo=10.0)
    out = head_group_evictions(head, (near, slack), 0, 0, 0, MISTRAL, 1e9, now=0.0,
                               head_time_s=12.0)
    assert [rid for rid, _ in out.victims] == ["slack"]
    alone = head_group_evictions(head, (near,), 0, 0, 0, MISTRAL, 1e9, now=0.0,
                                 head_time_s=12.0)
    assert alone.victims == ()
