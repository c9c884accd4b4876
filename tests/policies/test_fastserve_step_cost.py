"""FastServe's per-step shortcuts (issue 30 item 7, speed under memory pressure) give the
plain computation's answers: the job order kept between the events that change it, and
the churn bound's hold-time bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import Request
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import StepPlan
from andante.policies.fastserve.churn import ChurnBound
from andante.policies.fastserve.mlfq import SkipJoinMLFQ, geometric_quanta
from tests.engine.helpers import make_engine, make_request

_OPS = st.lists(st.tuples(st.sampled_from(["add", "remove", "charge", "promote", "run"]),
                          st.integers(0, 7), st.floats(0.0, 0.05)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_the_kept_order_is_the_queues_order_after_any_events(ops: list) -> None:
    mlfq = SkipJoinMLFQ(geometric_quanta(0.01, 2.0, 4), starve_limit=0.1)
    reqs = [make_request(f"r{k}", 8, 4) for k in range(8)]
    now = 0.0
    for op, k, x in ops:
        req, now = reqs[k], now + x
        queued = req in mlfq._jobs
        if op == "add" and not queued:
            mlfq.add(req, x, now)
        elif op == "remove":
            mlfq.remove(req)
        elif op == "charge" and queued:
            mlfq.charge(req, x, lambda r: 0.001)
        elif op == "promote":
            mlfq.promote_starved(now)
        elif op == "run" and queued:
            mlfq.mark_run(req, now)
        order = mlfq.ordered()
        assert order == [r for queue in mlfq._queues for r in queue]
        order.clear()  # a caller's list is its own
        assert len(mlfq.ordered()) == len(mlfq)


class _CountingChurn(ChurnBound):
    calls = 0

    def hold_time(self, req: Request, num_slots: int) -> float:
        self.calls += 1
        return super().hold_time(req, num_slots)


def test_a_job_held_past_any_swap_cost_is_not_weighed_again() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=64, num_host_blocks=64)
    reqs = [make_request(f"r{k}", 8, 50) for k in range(3)]
    for req in reqs:
        engine.add_request(req)
    engine.step()
    s = engine.scheduler
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    churn = _CountingChurn(cost, swaps=True, prefill_rate=1e4, max_evictions=None)

    def plan_at(now: float) -> StepPlan:
        return StepPlan(s.kv, s.config, now, s.waiting, s.running, s.swapped)

    first = plan_at(0.0)
    first.scheduled.extend(reqs)
    churn.after_step(first)  # all three came onto the device at 0
    longest = churn.longest_hold(first.num_slots_in(first.num_total_blocks))
    young = churn.protected(plan_at(0.0), reqs)
    assert set(young) == set(reqs) and churn.calls == 3
    churn.calls = 0
    assert churn.protected(plan_at(longest), reqs) == {}
    assert churn.calls == 0  # before: each job's swap time was computed again
    # the bound holds for any job: its hold time at the whole device is the longest
    assert all(churn.hold_time(r, first.num_slots_in(first.num_total_blocks)) <= longest
               for r in reqs)


def test_no_transfer_budget_is_planned_where_no_kv_can_move(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under memory pressure with the host tier full, most steps can neither swap a
    spare job out nor swap a placed one in: their transfer budget and ENST order are not
    computed (before: 7,843 budgets in this run's 21,576 steps; now 4,243)."""
    from andante.engine.config import SchedulerConfig
    from andante.policies.fastserve.kvcache import KVPlanner
    from andante.sim import ClusterSpec, simulate
    from andante.workload import WorkloadConfig, build_workload

    calls = []
    plain = KVPlanner._transfer_budget

    def counted(self: KVPlanner, plan: StepPlan, *claims: list) -> float:
        calls.append(plan.now)
        return plain(self, plan, *claims)

    monkeypatch.setattr(KVPlanner, "_transfer_budget", counted)
    workload = build_workload(WorkloadConfig(kind="poisson", rate=1.5, num_requests=300,
                                             lengths="sharegpt", max_context=8192, seed=0))
    spec = ClusterSpec(policy="fastserve", num_kv_blocks=1200,
                       scheduler=SchedulerConfig(max_model_len=8192))
    run = simulate(spec, workload, keep_records=False)
    assert run.summary.num_finished == 300
    assert sum(s.num_steps for s in run.report.instance_stats) == 21_576
    assert len(calls) < 5_000


def test_a_step_whose_swap_outs_empty_the_spare_jobs_still_prefetches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Proactive swapping with swap-in after swap-out: a step that swaps out every spare
    job still prefetches the next jobs (the shortcut once kept `spare`, the list
    `_make_room` empties, as its "proactive" flag and skipped the prefetch)."""
    from andante.engine.config import SchedulerConfig
    from andante.policies.fastserve.kvcache import KVPlanner
    from andante.sim import ClusterSpec, simulate
    from andante.workload import WorkloadConfig, build_workload

    emptied: set[float] = set()
    prefetched_after: list[float] = []
    make_room, prefetch = KVPlanner._make_room, KVPlanner._prefetch

    def recorded_make_room(self: KVPlanner, plan: StepPlan, reserve: int, spare: list,
                           *rest: object) -> float:
        moved = make_room(self, plan, reserve, spare, *rest)  # type: ignore[arg-type]
        if not spare:
            emptied.add(plan.now)
        return moved

    def recorded_prefetch(plan: StepPlan, *rest: object) -> None:
        if plan.now in emptied:
            prefetched_after.append(plan.now)
        prefetch(plan, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(KVPlanner, "_make_room", recorded_make_room)
    monkeypatch.setattr(KVPlanner, "_prefetch", staticmethod(recorded_prefetch))
    workload = build_workload(WorkloadConfig(kind="poisson", rate=2.0, num_requests=120,
                                             lengths="sharegpt", max_context=8192, seed=1))
    spec = ClusterSpec(policy="fastserve", num_kv_blocks=500, swap_space_gib=0.05,
                       policy_options={"kv_mode": "proactive", "swap_in_after_swap_out": True,
                                       "starve_limit": 0.5},
                       scheduler=SchedulerConfig(max_model_len=8192))
    run = simulate(spec, workload, keep_records=False)
    assert run.summary.num_finished == 120
    assert emptied and prefetched_after
