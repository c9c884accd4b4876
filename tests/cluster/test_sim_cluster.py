"""The simulator drives the real cluster controller over simulated instances."""

from __future__ import annotations

from andante.cluster import Controller
from andante.cluster.instance import Instance
from andante.core import RequestStatus
from andante.core.sampling import SLO
from andante.sim import ClusterSpec, build_simulator, simulate
from andante.workload import RequestSpec, WorkloadConfig, build_workload, to_requests
from andante.workload.slo import SLOConfig


def _workload(n: int = 80, rate: float = 30.0, ttft: float | None = None, seed: int = 1
              ) -> list[RequestSpec]:
    slo = SLOConfig(ttft=ttft, tds_distribution="none") if ttft else SLOConfig()
    return build_workload(WorkloadConfig(kind="poisson", rate=rate, num_requests=n,
                                         lengths="uniform:16:512:8:128", seed=seed, slo=slo))


def test_simulator_runs_the_cluster_controller() -> None:
    """Structural: the simulator has no router loop of its own; it drives the same
    Controller class the server uses, over instances that satisfy the Instance seam."""
    sim = build_simulator(ClusterSpec(num_instances=3, router="least-loaded"))
    assert type(sim.controller) is Controller
    assert type(sim.controller).__module__ == "andante.cluster.controller"
    assert [slot.instance for slot in sim.controller.slots] == sim.instances
    for inst in sim.instances:
        checked: Instance = inst  # mypy checks the protocol; here its members exist
        assert checked.alive and checked.capabilities >= {"submit", "abort", "withdraw"}


def test_every_router_serves_every_request() -> None:
    for router in ("round-robin", "least-loaded", "power-of-two"):
        run = simulate(ClusterSpec(num_instances=3, router=router), _workload())
        assert len(run.report.finished) == 80 and not run.report.unfinished, router
        assert all(s.num_steps > 0 for s in run.report.instance_stats), router


def test_load_reports_predict_a_drain_time() -> None:
    sim = build_simulator(ClusterSpec(num_instances=2))
    requests = to_requests(_workload(n=40, rate=100_000.0))
    sim.run(requests, until=0.03)
    reports = [inst.load() for inst in sim.instances]
    assert all(r.drain_time > 0 and r.num_received == 20 for r in reports)
    assert all(r.stats.num_requests == 20 and 0 < r.stats.kv_usage < 1 for r in reports)


def test_migrating_a_waiting_request_moves_it() -> None:
    sim = build_simulator(ClusterSpec(num_instances=2))
    requests = to_requests(_workload(n=30, rate=10_000.0))
    sim.run(requests[:0])
    for req in requests:  # everything lands on instance 0's queue...
        sim.controller._place(req, 0)
    last = requests[-1]
    assert sim.controller.migrate(last.request_id, 1)  # ...but the last one moves at once
    assert sim.controller.owner_of(last.request_id) == 1
    assert last.request_id in sim.instances[1].engine.scheduler.requests
    assert not sim.controller.migrate(last.request_id, 1)


def test_late_requests_are_dropped_and_decode_runs_stay_exact() -> None:
    workload = _workload(n=300, rate=400.0, ttft=0.5)
    spec = ClusterSpec(num_instances=1, drop_late=True)
    stepped = simulate(spec, workload, decode_runs=False)
    fast = simulate(spec, workload, decode_runs=True)
    dropped = [r for r in fast.requests if r.status == RequestStatus.FINISHED_ABORTED]
    assert dropped and all(not r.output_token_ids for r in dropped)
    assert all(r.timeline.finish_time > r.arrival_time + 0.5 for r in dropped)
    assert {r.request_id: tuple(r.timeline.token_times) for r in fast.requests} == {
        r.request_id: tuple(r.timeline.token_times) for r in stepped.requests}
    assert fast.report.instance_stats[0].num_steps == stepped.report.instance_stats[0].num_steps
    kept = simulate(ClusterSpec(num_instances=1), workload)
    assert not any(r.status == RequestStatus.FINISHED_ABORTED for r in kept.requests)


def test_a_request_without_ttft_is_never_dropped() -> None:
    spec = ClusterSpec(num_instances=1, drop_late=True)
    workload = [RequestSpec(0.0, 4000, 50, SLO()) for _ in range(200)]
    run = simulate(spec, workload)
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in run.requests)


def test_an_aborted_request_is_reported_finished() -> None:
    sim = build_simulator(ClusterSpec(num_instances=2))
    requests = to_requests([RequestSpec(0.0, 64, 8) for _ in range(10)])
    for req in requests:
        sim.controller.submit(req)
    assert sim.controller.abort(requests[3].request_id)
    report = sim.run([])
    assert requests[3] in report.finished and requests[3].status == RequestStatus.FINISHED_ABORTED
    assert len(report.finished) == 10 and sim.controller.num_owned == 0
