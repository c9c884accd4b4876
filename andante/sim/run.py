"""One call to simulate a workload on a cluster and summarize it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

from andante.cluster.router import Router
from andante.core.request import Request, RequestStatus
from andante.metrics.record import RequestRecord, records_from_requests
from andante.metrics.summary import Summary, SummaryStream, summarize
from andante.sim.setup import build_simulator
from andante.sim.simulator import SimReport
from andante.sim.spec import ClusterSpec
from andante.workload.spec import RequestSpec, to_request, to_requests

RecordSink = Callable[[RequestRecord], None]


@dataclass(slots=True)
class SimRun:
    """A run's outcome. `records` (and the finished requests of `report`) are kept only
    when `simulate(..., keep_records=True)`; a streamed run keeps its summary alone."""

    spec: ClusterSpec
    report: SimReport
    records: list[RequestRecord]
    summary: Summary
    wall_seconds: float

    @property
    def requests(self) -> list[Request]:
        return self.report.finished + self.report.unfinished


class _LazyRequests(Iterator[Request]):
    """The workload's requests ("req-<index>"), each made when the simulator reaches it."""

    def __init__(self, workload: Iterable[RequestSpec]) -> None:
        self._specs = enumerate(workload)
        self.last: Request | None = None

    def __next__(self) -> Request:
        index, spec = next(self._specs)
        self.last = to_request(spec, f"req-{index}")
        return self.last


def simulate(
    spec: ClusterSpec,
    workload: Sequence[RequestSpec],
    until: float | None = None,
    router: Router | None = None,
    on_finish: Callable[[Request], None] | None = None,
    goodput_thresholds: Mapping[str, float] | None = None,
    decode_runs: bool = True,
    *,
    keep_records: bool = True,
    on_record: RecordSink | None = None,
) -> SimRun:
    """Run `workload` (fresh requests each call) on `spec` and summarize the outcome.

    keep_records=False streams: requests are made as they arrive, each finished one
    becomes a record passed to `on_record` and to a `SummaryStream` and is then dropped,
    so memory does not grow with the number of requests (the summary's ITL percentiles
    are then within `andante.metrics.sketch.ITL_RELATIVE_ERROR` of the kept run's).
    """
    if not keep_records:
        return _simulate_streamed(spec, workload, until, router, on_finish,
                                  goodput_thresholds, decode_runs, on_record)
    requests = to_requests(workload)
    simulator = build_simulator(spec, router, decode_runs)
    started = time.perf_counter()
    report = simulator.run(requests, until=until, on_finish=on_finish)
    wall = time.perf_counter() - started
    records = records_from_requests(requests, report.delivery_delay)
    if on_record is not None:
        for record in records:
            on_record(record)
    end = report.end_time + report.delivery_delay  # the last token reaches its client
    duration = end - min((r.arrival_time for r in requests), default=0.0)
    summary = summarize(
        records,
        duration=duration if duration > 0 else None,
        goodput_thresholds=goodput_thresholds,
        now=end,
    )
    return SimRun(spec, report, records, summary, wall)


def _simulate_streamed(
    spec: ClusterSpec,
    workload: Sequence[RequestSpec],
    until: float | None,
    router: Router | None,
    on_finish: Callable[[Request], None] | None,
    goodput_thresholds: Mapping[str, float] | None,
    decode_runs: bool,
    on_record: RecordSink | None,
) -> SimRun:
    stream = SummaryStream(goodput_thresholds)

    delay = [0.0]  # the simulator's delivery delay, known once it is built

    def record(req: Request) -> None:
        rec = RequestRecord.from_request(req, delay[0])
        stream.add(rec)
        if on_record is not None:
            on_record(rec)

    def finished(req: Request) -> None:
        record(req)
        if on_finish is not None:
            on_finish(req)

    lazy = _LazyRequests(workload)
    simulator = build_simulator(spec, router, decode_runs)
    delay[0] = simulator.delivery_delay
    started = time.perf_counter()
    report = simulator.run(lazy, until=until, on_finish=finished, keep_finished=False)
    wall = time.perf_counter() - started
    for req in chain(report.unfinished, _never_submitted(lazy, report.unfinished), lazy):
        record(req)
    end = report.end_time + report.delivery_delay  # the last token reaches its client
    duration = end - (stream.first_arrival if stream.first_arrival < math.inf
                                  else 0.0)
    summary = stream.summary(duration if duration > 0 else None, now=end)
    return SimRun(spec, report, [], summary, wall)


def _never_submitted(lazy: _LazyRequests, unfinished: list[Request]) -> list[Request]:
    """The request the simulator took but never submitted (its arrival is past `until`)."""
    last = lazy.last
    if last is None or last.status != RequestStatus.WAITING:
        return []
    return [] if any(req is last for req in unfinished) else [last]
