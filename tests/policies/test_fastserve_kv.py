"""FastServe's KV-cache management (§4.2): ENST order of swaps, no ping-pong, overlap."""

from __future__ import annotations

import pytest

from andante.core import PreemptionMode, Request, RequestStatus
from andante.engine import Engine
from andante.exec.batch import StepBatch
from andante.exec.sim_executor import SimExecutor
from andante.kv import KVBlockManager
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import StepPlan
from andante.policies.fastserve.choice import choose
from andante.policies.fastserve.kvcache import KVPlanner
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload, to_requests
from tests.engine.helpers import ScriptedPolicy, make_engine, make_request


def _four_running(num_blocks: int = 16) -> tuple[Engine, list[Request]]:
    engine, _, _ = make_engine("vllm", num_device_blocks=num_blocks, num_host_blocks=64)
    reqs = [make_request(f"r{k}", 8, 50, arrival=k * 1e-3) for k in range(4)]
    for req in reqs:
        engine.add_request(req)
    engine.step()  # four prefills: 2 blocks each
    assert all(r.status == RequestStatus.RUNNING for r in reqs)
    return engine, reqs


def _plan(engine: Engine) -> StepPlan:
    s = engine.scheduler
    return StepPlan(s.kv, s.config, engine.clock.now(), s.waiting, s.running, s.swapped)


def test_room_is_made_by_swapping_out_the_largest_enst_first() -> None:
    engine, (r0, r1, r2, r3) = _four_running()
    big = make_request("big", 32, 4)  # 8 blocks
    engine.add_request(big)
    plan = _plan(engine)
    choice = choose(plan, [big, r0, r1, r2, r3], reserve=0, run_swapped=True)
    assert choice.unplaced == [r2, r3]
    enst = {r0: 0.0, r1: 0.0, r2: 1.0, r3: 9.0}
    KVPlanner("reactive", None, 1.0).apply(plan, choice, [big, r0, r1, r2, r3], 0,
                                           lambda jobs: {r: enst[r] for r in jobs})
    assert plan.preemptions == [(r3, PreemptionMode.SWAP)]  # 2 blocks were enough
    assert plan.scheduled == [big, r0, r1]  # r2 keeps its KV on the device, paused


def test_proactive_swaps_in_the_smallest_enst_first_without_running_them() -> None:
    engine, reqs = _four_running()
    r0, r1, r2, r3 = reqs
    engine.scheduler.policy = ScriptedPolicy(
        lambda plan: [plan.preempt(r, PreemptionMode.SWAP) for r in (r1, r2, r3)])
    engine.step()
    assert [r.status for r in reqs[1:]] == [RequestStatus.SWAPPED] * 3
    plan = _plan(engine)
    choice = choose(plan, reqs, reserve=0, run_swapped=False)
    assert plan.claimed == [r0] and choice.to_fetch == [r1, r2, r3]
    enst = {r0: 0.0, r1: 5.0, r2: 1.0, r3: 3.0}
    KVPlanner("proactive", None, 1.0).apply(plan, choice, reqs, 0,
                                            lambda jobs: {r: enst[r] for r in jobs})
    assert plan.swap_ins == [r2, r3, r1]
    assert plan.scheduled == [r0] and not plan.preemptions


def _capture_plans(engine: Engine) -> list[StepPlan]:
    plans: list[StepPlan] = []
    policy = engine.scheduler.policy
    inner = policy.schedule

    def schedule(plan: StepPlan) -> None:
        inner(plan)
        plans.append(plan)

    policy.schedule = schedule  # type: ignore[method-assign]
    return plans


@pytest.mark.parametrize("mode", ["proactive", "reactive"])
@pytest.mark.parametrize("policy", ["fastserve", "fastserve-fcfs"])
def test_no_request_is_swapped_in_and_out_in_one_step(policy: str, mode: str) -> None:
    spec = ClusterSpec(model="opt-13b", hardware="a100-40g", policy=policy,
                       policy_options={"kv_mode": mode, "starve_limit": 1.0},
                       gpu_memory_utilization=0.75, swap_space_gib=64, overlap_swaps=True)
    sim = build_simulator(spec)
    plans = _capture_plans(sim.instances[0].engine)
    workload = build_workload(WorkloadConfig(rate=4.0, num_requests=60, lengths="sharegpt",
                                             max_context=2048, seed=3))
    report = sim.run(to_requests(workload))
    assert not report.unfinished
    swapping = [p for p in plans if p.swap_ins or p.preemptions]
    assert swapping, "the cache was never short: the test checks nothing"
    for plan in plans:
        swapped_out = {r.request_id for r, m in plan.preemptions if m == PreemptionMode.SWAP}
        swapped_in = {r.request_id for r in plan.swap_ins}
        assert not swapped_out & swapped_in
        if swapped_out and mode == "proactive":  # FastServe's code: no swap-in ahead then
            scheduled = {r.request_id for r in plan.scheduled}
            assert swapped_in <= scheduled


def test_swapped_out_blocks_are_reused_last() -> None:
    kv = KVBlockManager(block_size=1, num_device_blocks=6, num_host_blocks=6, watermark=0.0)
    kv.allocate("a", 2)
    kv.swap_out("a")  # its blocks may still be in transit: hand out the others first
    assert set(kv.allocate("b", 4)).isdisjoint({0, 1})
    assert set(kv.allocate("c", 2)) == {0, 1}
    kv.check_invariants()


def _swap_batch(needed: bool) -> StepBatch:
    """One decoding request; 100 blocks copied in, into its own table or not."""
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    req = make_request("a", 16, 4)
    table = list(range(100)) if needed else [500]
    return StepBatch(requests=[req], num_new_tokens=[1], num_cached_tokens=[16],
                     samples=[True], block_tables=[table],
                     swap_in=[(h, d) for h, d in zip(range(100), range(100), strict=True)]), cost


def test_overlapped_swaps_delay_a_step_only_when_it_needs_the_blocks() -> None:
    batch, cost = _swap_batch(needed=False)
    forward = cost.step_time(batch.shape())
    swap = cost.swap_time(100 * 16)
    ahead = SimExecutor(cost, overlap_swaps=True).execute(batch)
    assert ahead.duration == pytest.approx(max(forward, swap))  # prefetch: hidden
    batch, cost = _swap_batch(needed=True)
    needed = SimExecutor(cost, overlap_swaps=True).execute(batch)
    assert needed.duration == pytest.approx(swap + forward)  # reactive: on the path
    serial = SimExecutor(cost, overlap_swaps=False).execute(batch)
    assert serial.duration == pytest.approx(swap + forward)
