"""The slim `Policy` contract: a policy implementing only it (no base class, no
`SimFastPath`) runs correctly in the engine and, unchanged, in the simulator, which then
simulates every step; the policies that do implement the fast paths still offer them."""

from __future__ import annotations

from typing import Any

import pytest

from andante.core import ManualClock, PreemptionMode, Request
from andante.engine.fast_path import FastPathDefaults, SimFastPath
from andante.engine.plan import StepPlan
from andante.engine.policy import Policy, PolicyContext
from andante.exec.batch import StepBatch, StepResult
from andante.policies import SchedulerConfig, policy_class, policy_names
from andante.policies.phases import admit_in_order, by_arrival, prefill_first_step
from andante.sim import ClusterSpec, build_simulator, simulate
from andante.workload import WorkloadConfig, build_workload
from tests.engine.helpers import make_engine, make_request, run_to_completion

MINIMAL = f"{__name__}:ArrivalOrder"


class ArrivalOrder:
    """vLLM v0's prefill-first FCFS loop written against `Policy` alone: the members the
    contract names and a constructor taking the context, nothing else."""

    name = "arrival-order"
    chunks_prefill = False

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self.num_arrivals = self.num_finishes = self.num_steps = 0

    def schedule(self, plan: StepPlan) -> None:
        plan.waiting.sort(key=by_arrival)  # (recomputed requests went to the front)
        prefill_first_step(plan, lambda p: admit_in_order(p, p.waiting))

    def on_arrival(self, req: Request) -> None:
        self.num_arrivals += 1

    def on_finish(self, req: Request) -> None:
        self.num_finishes += 1

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None:
        self.num_steps += 1


def _timelines(run: Any) -> dict[str, tuple]:
    return {r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                           r.timeline.num_swaps_out, r.status) for r in run.requests}


def test_the_minimal_policy_implements_policy_and_not_the_fast_path() -> None:
    policy: Policy = ArrivalOrder(PolicyContext(ManualClock(), SchedulerConfig()))
    assert not isinstance(policy, SimFastPath)
    assert not isinstance(policy, FastPathDefaults)
    assert policy_class(MINIMAL) is ArrivalOrder


def test_the_minimal_policy_serves_every_request_on_the_engine() -> None:
    """Under KV pressure (preemptions by recompute): the same steps as vllm-v0."""
    outcomes = {}
    for name in (MINIMAL, "vllm-v0"):
        engine, executor, clock = make_engine(name, num_device_blocks=40)
        for i in range(12):
            engine.add_request(make_request(f"r{i}", 20 + 7 * i, 30, arrival=0.0))
        steps = run_to_completion(engine, clock)
        batches = [([r.request_id for r in b.requests], b.num_new_tokens)
                   for b in executor.batches]
        outcomes[name] = (steps, batches, engine.scheduler.num_preemptions)
    policy = outcomes[MINIMAL]
    assert policy == outcomes["vllm-v0"]
    assert policy[2] > 0  # the KV pressure did preempt


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_the_minimal_policy_runs_in_the_simulator(mode: PreemptionMode) -> None:
    """The simulator steps a policy without fast paths, with or without runs enabled,
    and its decisions are vllm-v0's, which the simulator applies in runs."""
    workload = build_workload(WorkloadConfig(
        kind="gamma", rate=40.0, cv=3.0, num_requests=120, lengths="uniform:32:1500:1:300",
        seed=3))

    def spec(policy: str) -> ClusterSpec:
        return ClusterSpec(model="llama-3.1-8b", hardware="a10-24g", num_instances=2,
                           policy=policy, gpu_memory_utilization=0.85,
                           scheduler=SchedulerConfig(preemption_mode=mode, max_num_seqs=64))

    sim = build_simulator(spec(MINIMAL))
    assert all(inst.fast_path() is None for inst in sim.instances)
    minimal = simulate(spec(MINIMAL), workload)
    stepped = simulate(spec(MINIMAL), workload, decode_runs=False)
    reference = simulate(spec("vllm-v0"), workload)
    assert minimal.summary.num_finished == len(workload)
    assert _timelines(minimal) == _timelines(stepped) == _timelines(reference)
    assert minimal.report.end_time == reference.report.end_time
    # every step was simulated: as many as vllm-v0 takes, most of them in runs there
    steps = [s.num_steps for s in minimal.report.instance_stats]
    assert steps == [s.num_steps for s in reference.report.instance_stats]
    policies = [inst.engine.scheduler.policy for inst in sim.instances]
    assert all(isinstance(p, ArrivalOrder) for p in policies)


@pytest.mark.parametrize("name", policy_names())
def test_every_registered_policy_offers_the_fast_paths(name: str) -> None:
    """Every built-in policy implements `SimFastPath` (its runs are tested against
    stepping in tests/sim and tests/policies)."""
    assert issubclass(policy_class(name), FastPathDefaults)
