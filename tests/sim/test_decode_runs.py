"""Decode runs (applying identical decode steps at once) change nothing but speed."""

from __future__ import annotations

import pytest

from andante.core import PreemptionMode
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import WorkloadConfig, build_workload


def _timelines(run) -> dict[str, tuple]:  # type: ignore[no-untyped-def]
    return {
        r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                       r.timeline.num_swaps_out, r.status)
        for r in run.requests
    }


@pytest.mark.parametrize("policy", ["vllm", "vllm-v0", "sarathi", "priority", "edf", "sjf"])
@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_decode_runs_give_identical_timelines(policy: str, mode: PreemptionMode) -> None:
    workload = build_workload(WorkloadConfig(
        kind="gamma", rate=40.0, cv=3.0, num_requests=150, lengths="uniform:32:1500:1:300",
        seed=3,
    ))
    # a small KV cache so that preemptions and swaps happen too
    spec = ClusterSpec(
        model="llama-3.1-8b", hardware="a10-24g", num_instances=2, policy=policy,
        scheduler=SchedulerConfig(preemption_mode=mode, max_num_seqs=64),
        gpu_memory_utilization=0.85,
    )
    stepped = simulate(spec, workload, decode_runs=False)
    fast = simulate(spec, workload, decode_runs=True)
    assert _timelines(fast) == _timelines(stepped)
    assert fast.report.end_time == stepped.report.end_time
    steps = [s.num_steps for s in fast.report.instance_stats]
    assert steps == [s.num_steps for s in stepped.report.instance_stats]


def test_until_is_respected_by_decode_runs() -> None:
    workload = build_workload(WorkloadConfig(kind="poisson", rate=5.0, num_requests=20,
                                             lengths="fixed:64:2000", seed=0))
    stepped = simulate(ClusterSpec(), workload, until=3.0, decode_runs=False)
    fast = simulate(ClusterSpec(), workload, until=3.0, decode_runs=True)
    assert _timelines(fast) == _timelines(stepped)
