"""Ascendra end to end in the simulator."""

from __future__ import annotations

from andante.metrics.slo import is_good_by_slo
from andante.sim import build_simulator, simulate
from andante.workload import to_requests
from experiments.ascendra_setup import ASCENDRA, SETUPS, VLLM


def test_two_lp_one_hp_serve_everything_with_offloads_and_tickets() -> None:
    setup = SETUPS[0]
    workload = setup.workload(12.0, 400, seed=2)  # well above three instances' capacity
    sim = build_simulator(ASCENDRA.spec(setup))
    requests = to_requests(workload)
    report = sim.run(requests)
    assert len(report.finished) == 400 and not report.unfinished
    router = sim.controller.router
    assert router.num_offloads > 0 and router.num_ticketed > 0  # type: ignore[attr-defined]
    roles = [inst.role for inst in sim.instances]
    assert roles == ["lp", "lp", "hp"]
    hp_policy = sim.instances[2].engine.scheduler.policy
    assert hp_policy.perf_model.error is not None  # type: ignore[attr-defined]
    ours = sum(is_good_by_slo(r) for r in simulate(ASCENDRA.spec(setup), workload).records)
    theirs = sum(is_good_by_slo(r) for r in simulate(VLLM.spec(setup), workload).records)
    assert ours > theirs  # overloaded FCFS loses more requests' SLOs
