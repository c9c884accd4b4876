"""Runs that hold the step straddling the next arrival (andante.sim.simulator
`_straddles`): it is decided before the arrival, so it needs no decision where the
arrival neither reads nor changes what the run's replay does (a run of its own where
observers read each output's queues). Timelines stay those of stepping, and the
scheduler decides fewer steps."""

from __future__ import annotations

import pytest

from andante.core.request import Request
from andante.sim import ClusterSpec, build_simulator
from andante.sim.simulator import Simulator
from andante.workload import WorkloadConfig, build_workload, to_requests


def _workload(rate: float = 3.0, num_requests: int = 80):  # type: ignore[no-untyped-def]
    return build_workload(WorkloadConfig(kind="poisson", rate=rate, num_requests=num_requests,
                                         lengths="uniform:16:1500:20:300", seed=3))


def _run(policy: str, decode_runs: bool, straddle: bool = True, num_instances: int = 1,
         observed: bool = False) -> tuple[dict[str, object], int, list[int]]:
    """Timelines, decisions and the lengths of the runs that straddled an arrival."""
    sim = build_simulator(ClusterSpec(policy=policy, num_instances=num_instances),
                          decode_runs=decode_runs)
    if not straddle:
        sim._straddles = lambda inst: False  # type: ignore[method-assign]
    requests = to_requests(_workload())
    arrivals = sorted(r.arrival_time for r in requests)
    straddled: list[int] = []
    decisions: list[int] = []
    for inst in sim.instances:
        scheduler = inst.engine.scheduler
        schedule = scheduler.schedule

        def counted(schedule=schedule):  # type: ignore[no-untyped-def]
            decisions.append(1)
            return schedule()

        scheduler.schedule = counted  # type: ignore[method-assign]
        begin = inst._begin_run

        def begin_run(batch, times, *rest, begin=begin, inst=inst):  # type: ignore[no-untyped-def]
            start = inst.engine.clock.now()
            if any(start < a < times[-1] for a in arrivals):
                if observed:  # observers read each output's queues: a run of its own
                    assert len(times) == 1
                straddled.append(len(times))
            begin(batch, times, *rest)

        inst._begin_run = begin_run  # type: ignore[method-assign]
        if observed:
            inst.engine.add_observer(lambda output, stats: None)
    sim.run(requests)
    return _lines(requests), len(decisions), straddled


def _lines(requests: list[Request]) -> dict[str, object]:
    return {r.request_id: (tuple(r.timeline.token_times), r.status,
                           tuple(r.timeline.preemption_times)) for r in requests}


@pytest.mark.parametrize("observed", [False, True])
@pytest.mark.parametrize("policy", ["vllm", "andes", "lqsf", "sarathi"])
def test_straddling_runs_keep_the_stepped_timelines(policy: str, observed: bool) -> None:
    stepped, stepped_steps, _ = _run(policy, decode_runs=False)
    fast, fast_steps, straddled = _run(policy, decode_runs=True, observed=observed)
    plain, plain_steps, _ = _run(policy, decode_runs=True, straddle=False)
    assert fast == stepped == plain
    assert straddled  # some runs ended after an arrival ...
    assert observed or max(straddled) > 1  # (unobserved: steps before it in the run)
    assert fast_steps < plain_steps < stepped_steps  # ... and spared a decision each


@pytest.mark.parametrize("policy", ["fastserve", "fastserve-fcfs"])
def test_not_where_an_arrival_meets_the_replayed_state(policy: str) -> None:
    """FastServe's arrival joins an MLFQ queue whose order the run's replay changes
    (demotions): its runs stop before arrivals, and timelines stay the stepped ones."""
    stepped, _, _ = _run(policy, decode_runs=False)
    fast, _, straddled = _run(policy, decode_runs=True)
    assert fast == stepped
    assert not straddled


def test_not_on_several_instances() -> None:
    """A router reads the instances' loads at an arrival: runs stop before it."""
    sim = build_simulator(ClusterSpec(policy="vllm", num_instances=2))
    alone = build_simulator(ClusterSpec(policy="vllm"))
    assert isinstance(sim, Simulator)
    assert not sim._straddles(sim.instances[0])
    assert alone._straddles(alone.instances[0])
    stepped, _, _ = _run("vllm", decode_runs=False, num_instances=2)
    fast, _, straddled = _run("vllm", decode_runs=True, num_instances=2)
    assert fast == stepped and not straddled
