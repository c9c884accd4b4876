"""One call to simulate a workload on a cluster and summarize it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from andante.cluster.router import Router
from andante.core.request import Request
from andante.metrics.record import RequestRecord, records_from_requests
from andante.metrics.summary import Summary, summarize
from andante.sim.setup import ClusterSpec, build_simulator
from andante.sim.simulator import SimReport
from andante.workload.spec import RequestSpec, to_requests


@dataclass(slots=True)
class SimRun:
    spec: ClusterSpec
    report: SimReport
    records: list[RequestRecord]
    summary: Summary
    wall_seconds: float

    @property
    def requests(self) -> list[Request]:
        return self.report.finished + self.report.unfinished


def simulate(
    spec: ClusterSpec,
    workload: Sequence[RequestSpec],
    until: float | None = None,
    router: Router | None = None,
    on_finish: Callable[[Request], None] | None = None,
    goodput_thresholds: Mapping[str, float] | None = None,
    decode_runs: bool = True,
) -> SimRun:
    """Run `workload` (fresh requests each call) on `spec` and summarize the outcome."""
    requests = to_requests(workload)
    simulator = build_simulator(spec, router, decode_runs)
    started = time.perf_counter()
    report = simulator.run(requests, until=until, on_finish=on_finish)
    wall = time.perf_counter() - started
    records = records_from_requests(requests)
    duration = report.end_time - min((r.arrival_time for r in requests), default=0.0)
    summary = summarize(
        records,
        duration=duration if duration > 0 else None,
        goodput_thresholds=goodput_thresholds,
        now=report.end_time,
    )
    return SimRun(spec, report, records, summary, wall)
