"""Decode runs across finishes (andante.sim.after_finish): with nothing waiting, the run
after a finish starts at once, and timelines stay those of stepping."""

from __future__ import annotations

import pytest

from andante.sim import ClusterSpec, build_simulator
from andante.sim.after_finish import batch_after_finish
from andante.workload import WorkloadConfig, build_workload, to_requests


def _run(policy: str, decode_runs: bool):  # type: ignore[no-untyped-def]
    # sparse arrivals: the queue is mostly empty when requests finish
    workload = build_workload(WorkloadConfig(kind="poisson", rate=0.5, num_requests=60,
                                             lengths="uniform:16:400:20:400", seed=7))
    sim = build_simulator(ClusterSpec(policy=policy), decode_runs=decode_runs)
    engine = sim.instances[0].engine
    outputs: list[tuple[int, int]] = []  # (steps, finished) per output
    engine.add_observer(lambda out, stats: outputs.append((out.num_steps, len(out.finished))))
    requests = to_requests(workload)
    report = sim.run(requests)
    lines = {r.request_id: (tuple(r.timeline.token_times), r.status) for r in requests}
    return lines, report.end_time, report.instance_stats[0].num_steps, outputs


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "vllm-v0", "sjf", "static-batch",
                                    "ascendra-lp", "ascendra-hp", "fastserve",
                                    "fastserve-fcfs"])
def test_runs_follow_finishes_without_a_step(policy: str) -> None:
    stepped, stepped_end, stepped_steps, _ = _run(policy, decode_runs=False)
    fast, fast_end, fast_steps, outputs = _run(policy, decode_runs=True)
    assert fast == stepped and fast_end == stepped_end and fast_steps == stepped_steps
    # a run that ended with a finish is followed directly by another run
    assert any(a[1] and a[0] > 1 and b[0] > 1 for a, b in zip(outputs, outputs[1:], strict=False))


@pytest.mark.parametrize("policy", ["priority", "edf", "qlm-edf"])
def test_not_for_policies_that_reorder_their_batch(policy: str) -> None:
    """Sorted running lists and job orders (a decode batch not in the running order)
    are left to a step."""
    workload = build_workload(WorkloadConfig(kind="poisson", rate=0.5, num_requests=10,
                                             lengths="fixed:32:40", seed=1))
    sim = build_simulator(ClusterSpec(policy=policy))
    engine, fast = sim.instances[0].engine, sim.instances[0].fast_path()
    assert fast is not None
    seen: list[bool] = []
    engine.add_observer(lambda out, stats: seen.append(
        batch_after_finish(engine.scheduler, fast) is not None))
    sim.run(to_requests(workload))
    assert seen and not any(seen)


def test_only_where_requests_reach_instances_at_arrivals() -> None:
    """Ascendra's pools hand requests between instances (and its router keeps a queue):
    one could land amid a run, so only decode runs after a step apply there."""
    from andante.sim.spec import InstanceSpec

    plain = build_simulator(ClusterSpec(policy="vllm", num_instances=2))
    alone = build_simulator(ClusterSpec(policy="ascendra-lp"))
    pools = build_simulator(ClusterSpec(
        instances=(InstanceSpec(role="lp", policy="ascendra-lp"),
                   InstanceSpec(role="hp", policy="ascendra-hp")),
        router="ascendra"))
    for sim in (plain, alone, pools):
        sim.run([])
    assert plain._only_arrivals_add() and alone._only_arrivals_add()
    assert not pools._only_arrivals_add()
