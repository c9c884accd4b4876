from __future__ import annotations

import pytest

from andante.core import RequestStatus
from andante.engine.scheduler import Scheduler
from andante.metrics.sketch import ITL_RELATIVE_ERROR
from andante.sim import ClusterSpec, build_simulator, simulate
from andante.workload import WorkloadConfig, build_workload


def _workload(n: int = 60, rate: float = 20.0, seed: int = 1) -> list:
    return build_workload(
        WorkloadConfig(kind="poisson", rate=rate, num_requests=n, lengths="uniform:16:256:8:64",
                       seed=seed)
    )


def test_simulator_builds_the_engines_own_scheduler() -> None:
    """Structural: no simulator-only scheduler exists; instances run engine.Scheduler."""
    sim = build_simulator(ClusterSpec(num_instances=2))
    for inst in sim.instances:
        assert type(inst.engine.scheduler) is Scheduler
        assert type(inst.engine.scheduler).__module__ == "andante.engine.scheduler"


def test_all_requests_finish_with_consistent_timelines() -> None:
    run = simulate(ClusterSpec(num_instances=2), _workload())
    assert not run.report.unfinished and len(run.report.finished) == 60
    for req in run.report.finished:
        assert req.status == RequestStatus.FINISHED_LENGTH
        times = req.timeline.token_times
        assert len(times) == req.sampling.max_tokens
        assert times == sorted(times) and times[0] > req.arrival_time
    assert run.summary.num_finished == 60


def test_same_seed_same_result_and_round_robin_spreads_load() -> None:
    a = simulate(ClusterSpec(num_instances=3), _workload(seed=7))
    b = simulate(ClusterSpec(num_instances=3), _workload(seed=7))
    assert a.summary.to_dict() == b.summary.to_dict()
    steps = [s.num_steps for s in a.report.instance_stats]
    assert all(n > 0 for n in steps)


def test_more_load_means_longer_ttft() -> None:
    light = simulate(ClusterSpec(), _workload(rate=1.0))
    heavy = simulate(ClusterSpec(), _workload(rate=1000.0))
    assert heavy.summary.ttft.mean > light.summary.ttft.mean


def test_until_stops_early_and_reports_unfinished() -> None:
    run = simulate(ClusterSpec(), _workload(rate=1000.0), until=0.05)
    assert run.report.unfinished
    assert run.report.end_time <= 0.05


def test_bad_cluster_spec_is_refused() -> None:
    with pytest.raises(ValueError, match="num_instances"):
        ClusterSpec(num_instances=0)


def _close(a: float | None, b: float | None, rel: float) -> bool:
    return a == b or (a is not None and b is not None and abs(a - b) <= rel * abs(a) + 1e-12)


@pytest.mark.parametrize("until", [None, 8.0])
def test_streamed_summary_matches_the_kept_one(until: float | None) -> None:
    """Streaming keeps no records, yet gives the same summary: exact but for the pooled
    ITL percentiles, within the stated relative error."""
    workload = build_workload(WorkloadConfig(kind="poisson", rate=30.0, num_requests=300,
                                             lengths="uniform:16:2000:8:200", seed=3))
    spec = ClusterSpec(hardware="a10-24g")
    kept = simulate(spec, workload, until=until).summary.to_dict()
    seen: list[str] = []
    streamed_run = simulate(spec, workload, until=until, keep_records=False,
                            on_record=lambda r: seen.append(r.request_id))
    streamed = streamed_run.summary.to_dict()
    assert streamed_run.records == [] and streamed_run.report.finished == []
    assert sorted(seen) == sorted(f"req-{i}" for i in range(300))
    assert streamed["num_requests"] == 300
    for key, value in kept.items():
        rel = ITL_RELATIVE_ERROR if key.endswith("_itl_ms") else 1e-9
        assert _close(value, streamed[key], rel), (key, value, streamed[key])
