"""Prefill runs (chunked-prefill steps beside decodes applied at once) change nothing
but speed: identical timelines, steps and end times to stepping, and runs do happen."""

from __future__ import annotations

import pytest

from andante.core import PreemptionMode
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, build_simulator, simulate
from andante.sim.prefill_run import prefill_run_chunks
from andante.workload import WorkloadConfig, build_workload, to_requests


def _timelines(requests) -> dict[str, tuple]:  # type: ignore[no-untyped-def]
    return {
        r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                       r.timeline.num_swaps_out, r.status, r.num_computed_tokens)
        for r in requests
    }


def _spec(policy: str, mode: PreemptionMode, hardware: str) -> ClusterSpec:
    return ClusterSpec(
        model="llama-3.1-8b", hardware=hardware, num_instances=2, policy=policy,
        scheduler=SchedulerConfig(preemption_mode=mode, max_num_seqs=64,
                                  max_num_batched_tokens=2048),
        gpu_memory_utilization=0.85,
    )


def _run(spec: ClusterSpec, workload, decode_runs: bool):  # type: ignore[no-untyped-def]
    """Simulate; returns the requests and how many outputs stood for prefill runs."""
    sim = build_simulator(spec, decode_runs=decode_runs)
    prefill_runs: list[int] = []
    for inst in sim.instances:
        inst.engine.add_observer(lambda out, stats: prefill_runs.append(
            out.num_steps > 1 and out.batch.num_tokens > len(out.batch.requests)))
    requests = to_requests(workload)
    report = sim.run(requests)
    steps = [s.num_steps for s in report.instance_stats]
    return requests, report.end_time, steps, sum(prefill_runs)


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
@pytest.mark.parametrize(("mode", "hardware"), [(PreemptionMode.RECOMPUTE, "a100-80g"),
                                                (PreemptionMode.RECOMPUTE, "a10-24g"),
                                                (PreemptionMode.SWAP, "a10-24g")])
def test_prefill_runs_give_identical_timelines(policy: str, mode: PreemptionMode,
                                               hardware: str) -> None:
    # long prompts (several chunks each) between bursts; a small KV cache preempts too
    workload = build_workload(WorkloadConfig(
        kind="gamma", rate=6.0, cv=3.0, num_requests=120, lengths="uniform:500:7000:1:200",
        seed=5, max_context=8192,
    ))
    spec = _spec(policy, mode, hardware)
    stepped, stepped_end, stepped_steps, none = _run(spec, workload, decode_runs=False)
    fast, fast_end, fast_steps, num_runs = _run(spec, workload, decode_runs=True)
    assert none == 0 and num_runs > 0
    assert _timelines(fast) == _timelines(stepped)
    assert fast_end == stepped_end
    assert fast_steps == stepped_steps


def test_no_prefill_run_for_a_policy_that_does_not_declare_it() -> None:
    """A policy without `prefill_run_budget` (vllm-v0 prefills whole prompts) is never
    given one, and `prefill_run_chunks` says so for its batches."""
    workload = build_workload(WorkloadConfig(kind="poisson", rate=4.0, num_requests=40,
                                             lengths="uniform:500:3000:1:100", seed=1))
    spec = ClusterSpec(policy="vllm-v0")
    sim = build_simulator(spec)
    engine, fast = sim.instances[0].engine, sim.instances[0].fast_path()
    assert fast is not None
    seen: list[list[int]] = []
    engine.add_observer(lambda out, stats: seen.append(
        prefill_run_chunks(engine.scheduler, fast, out.batch)))
    sim.run(to_requests(workload))
    assert seen and not any(seen)


def test_sarathi_prefill_runs_cut_the_scheduler_steps() -> None:
    """Most of sarathi's 512-token chunks of long prompts are applied in runs: far fewer
    scheduler decisions than simulated steps, with the same result as stepping."""
    workload = build_workload(WorkloadConfig(kind="poisson", rate=0.5, num_requests=30,
                                             lengths="fixed:6000:20", seed=2))
    spec = ClusterSpec(policy="sarathi")
    runs = {}
    for decode_runs in (False, True):
        sim = build_simulator(spec, decode_runs=decode_runs)
        engine = sim.instances[0].engine
        decisions: list[int] = []
        engine.add_observer(lambda out, stats, d=decisions: d.append(out.num_steps))
        requests = to_requests(workload)
        report = sim.run(requests)
        runs[decode_runs] = (_timelines(requests), report.instance_stats[0].num_steps,
                             len(decisions))
    (stepped_lines, steps, _), (fast_lines, fast_steps, outputs) = runs[False], runs[True]
    assert fast_lines == stepped_lines and fast_steps == steps
    assert outputs < steps / 3


def test_simulate_figures_unchanged_by_prefill_runs() -> None:
    workload = build_workload(WorkloadConfig(kind="poisson", rate=2.0, num_requests=60,
                                             lengths="uniform:200:6000:1:300", seed=4))
    spec = ClusterSpec(policy="sarathi")
    stepped = simulate(spec, workload, decode_runs=False).summary.to_dict()
    fast = simulate(spec, workload, decode_runs=True).summary.to_dict()
    assert fast == stepped
