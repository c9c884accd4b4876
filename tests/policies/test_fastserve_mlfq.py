"""Skip-join MLFQ (FastServe §4.1, Algorithm 1) and ENST (§4.2), unit level."""

from __future__ import annotations

import pytest

from andante.core import ManualClock
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import PolicyContext, SchedulerConfig
from andante.policies.fastserve import FastServePolicy
from andante.policies.fastserve.mlfq import SkipJoinMLFQ, geometric_quanta
from tests.engine.helpers import make_request

QUANTA = [1.0, 2.0, 4.0, 8.0]


def _const(t: float):  # type: ignore[no-untyped-def]
    return lambda req: t


def test_geometric_quanta_and_validation() -> None:
    assert geometric_quanta(0.01, 2.0, 4) == pytest.approx([0.01, 0.02, 0.04, 0.08])
    with pytest.raises(ValueError, match="ratio"):
        geometric_quanta(0.01, 1.0, 4)
    with pytest.raises(ValueError, match="increasing"):
        SkipJoinMLFQ([2.0, 1.0], None)


@pytest.mark.parametrize(("first", "level"), [(0.5, 0), (1.0, 0), (1.5, 1), (3.0, 2), (99, 3)])
def test_skip_join_places_by_first_iteration_time(first: float, level: int) -> None:
    mlfq = SkipJoinMLFQ(QUANTA, None)
    req = make_request("a", 4, 4)
    mlfq.add(req, first, now=0.0)
    assert mlfq.state_of(req).level == level  # highest queue whose quantum covers it


def test_skip_join_with_cost_model_orders_by_prompt_length() -> None:
    cost = CostModel(get_model("opt-13b"), get_hardware("a100-40g"))
    ctx = PolicyContext(ManualClock(), SchedulerConfig(max_model_len=2048), cost)
    policy = FastServePolicy(ctx)
    q1 = policy.mlfq.quanta[0]
    assert q1 == pytest.approx(cost.decode_time(1, 1))  # q1 = the minimum iteration time
    assert policy.mlfq.quanta[1] == pytest.approx(2 * q1)  # ratio 2
    reqs = [make_request(f"p{n}", n, 8) for n in (1, 64, 512, 2000)]
    for req in reqs:
        policy.on_arrival(req)
    levels = [policy.mlfq.state_of(r).level for r in reqs]
    assert levels == sorted(levels) and levels[0] == 0 and levels[-1] > levels[1]
    for req, level in zip(reqs, levels, strict=True):
        assert policy.mlfq.quanta[level] >= cost.prefill_time(req.num_prompt_tokens)
        if level:
            assert policy.mlfq.quanta[level - 1] < cost.prefill_time(req.num_prompt_tokens)
    assert policy.order.ordered() == reqs  # shorter prefill, higher priority


def test_demotion_after_quantum_to_the_tail_of_the_next_queue() -> None:
    mlfq = SkipJoinMLFQ(QUANTA, None)
    a, b, c = (make_request(x, 4, 4) for x in "abc")
    mlfq.add(a, 0.5, 0.0)
    mlfq.add(b, 1.5, 0.0)  # Q2
    mlfq.add(c, 0.5, 0.0)
    mlfq.charge(a, 0.6, _const(0.1))
    assert mlfq.state_of(a).level == 0  # 0.6 < q1
    mlfq.charge(a, 0.6, _const(0.1))
    assert mlfq.state_of(a).level == 1 and mlfq.state_of(a).attained == 0.0
    assert mlfq.ordered() == [c, b, a]  # joined Q2 behind b
    mlfq.charge(c, 1.0, _const(3.0))  # next iteration needs 3 s: skips to Q3
    assert mlfq.state_of(c).level == 2
    mlfq.charge(c, 4.0, _const(0.1))
    mlfq.charge(c, 8.0, _const(0.1))
    assert mlfq.state_of(c).level == 3  # the last queue keeps it (round robin)
    mlfq.charge(c, 8.0, _const(0.1))
    assert mlfq.state_of(c).level == 3


def test_starvation_promotes_jobs_idle_for_alpha_to_q1() -> None:
    mlfq = SkipJoinMLFQ(QUANTA, starve_limit=3.0)
    old, fresh, front = (make_request(x, 4, 4) for x in ("old", "fresh", "front"))
    mlfq.add(old, 10.0, now=0.0)  # Q4
    mlfq.add(fresh, 10.0, now=2.0)
    mlfq.add(front, 0.5, now=2.5)
    mlfq.charge(old, 1.0, _const(0.1))
    assert mlfq.promote_starved(2.9) == []
    assert mlfq.promote_starved(3.0) == [old]  # idle 3 s >= alpha
    assert mlfq.state_of(old).level == 0 and mlfq.state_of(old).attained == 0.0
    assert mlfq.ordered()[:2] == [front, old]  # tail of Q1
    assert mlfq.state_of(old).last_run == 3.0  # starve time reset
    mlfq.mark_run(fresh, 4.0)  # running keeps a job from starving
    assert mlfq.promote_starved(6.5) == [front, old]  # the longest idle first
    assert mlfq.state_of(fresh).level == 3


def test_a_starved_job_already_in_q1_keeps_its_place_there() -> None:
    mlfq = SkipJoinMLFQ(QUANTA, starve_limit=3.0)
    old, later = make_request("old", 4, 4), make_request("later", 4, 4)
    mlfq.add(old, 0.5, now=0.0)  # Q1
    mlfq.add(later, 0.5, now=2.0)  # Q1, behind it
    assert mlfq.promote_starved(3.0) == [old]
    assert mlfq.ordered() == [old, later]  # before: old went to Q1's tail, behind later
    assert mlfq.state_of(old).last_run == 3.0


def test_no_starvation_prevention_when_alpha_is_none() -> None:
    mlfq = SkipJoinMLFQ(QUANTA, starve_limit=None)
    req = make_request("a", 4, 4)
    mlfq.add(req, 10.0, 0.0)
    assert mlfq.promote_starved(1e9) == [] and mlfq.state_of(req).level == 3


def test_enst_follows_the_paper_formulas() -> None:
    mlfq = SkipJoinMLFQ(QUANTA, starve_limit=None)
    j1, j2, j3, i = (make_request(x, 4, 4) for x in ("j1", "j2", "j3", "i"))
    mlfq.add(j1, 0.5, 0.0)  # Q1
    mlfq.add(j2, 1.5, 0.0)  # Q2
    mlfq.add(j3, 3.0, 0.0)  # Q3
    mlfq.add(i, 3.0, 0.0)  # Q3, behind j3
    mlfq.charge(j2, 0.5, _const(0.1))
    enst = mlfq.enst(batch_size=2, now=0.0, wanted=[j1, j2, j3, i])
    # T_execute(i, j) = sum of the quanta of the queues j passes before reaching i's queue,
    # less what j already attained there; j3 (same queue, ahead) runs its quantum out.
    assert enst[j1] == 0.0
    assert enst[j2] == pytest.approx(1.0 / 2)
    assert enst[j3] == pytest.approx((1.0 + 2.0 + (2.0 - 0.5)) / 2)
    assert enst[i] == pytest.approx((1.0 + 2.0 + (2.0 - 0.5) + 4.0) / 2)
    assert enst[j1] <= enst[j2] <= enst[j3] <= enst[i]


def test_enst_is_capped_by_the_time_to_promotion() -> None:
    mlfq = SkipJoinMLFQ(QUANTA, starve_limit=3.0)
    ahead = [make_request(f"h{k}", 4, 4) for k in range(10)]
    for req in ahead:
        mlfq.add(req, 0.5, now=10.0)
    deep = make_request("deep", 4, 4)
    mlfq.add(deep, 99.0, now=9.0)  # last queue, idle since t=9
    later = make_request("later", 4, 4)
    mlfq.add(later, 99.0, now=10.0)
    enst = mlfq.enst(batch_size=1, now=11.0, wanted=[deep, later])
    assert enst[deep] == pytest.approx(1.0)  # T_promote = 3 - (11 - 9) < T_execute
    assert enst[later] == pytest.approx(2.0)
    assert enst[deep] < enst[later]  # the older job will run first: promoted sooner
