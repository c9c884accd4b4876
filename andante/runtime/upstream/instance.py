"""One upstream server as an instance of the cluster layer (the `Instance` seam).

`submit` starts forwarding the request (a task on the event loop running the fleet's
`forward` coroutine), `abort` cancels that task (closing the upstream connection, which
makes vLLM and andante abort the request), `withdraw` cancels the ones that have not
streamed a byte yet and hands them back to the controller.

Its load report is built on demand from two sources: the upstream's own figures, polled
from its /metrics (`UpstreamLoad`, possibly a poll interval old and counting other
clients' requests too), and what andante has in flight there (exact, immediate). The
requests it holds are the larger of the two counts (the poll's running ones less those
of ours that ended since it), split into running and waiting as the poll saw them (at
least the started ones run); the ones without a first byte yet
count as prefilling (Ascendra's tickets read it). The predicted drain time is
`service_s` (the mean seconds per request through this upstream, learned from finished
requests) times (1 + requests / max_num_seqs): increasing in the load, so the routers'
least-expected-wait order holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from andante.cluster.instance import BASIC_CAPABILITIES, LaterOperations
from andante.cluster.load import LoadReport
from andante.core.clock import Clock
from andante.core.request import Request
from andante.engine.stats import SchedulerStats
from andante.runtime.upstream.discovery import UpstreamInfo
from andante.runtime.upstream.metrics import UpstreamLoad

if TYPE_CHECKING:
    Forward = Callable[["UpstreamInstance", Request], Coroutine[Any, Any, None]]
    HandBack = Callable[[int, list[Request]], None]

KV_SCALE = 10_000  # the KV usage as blocks of a notional cache of this size
INITIAL_SERVICE_S = 1.0
SERVICE_EWMA = 0.2


class UpstreamInstance(LaterOperations):
    capabilities = BASIC_CAPABILITIES

    def __init__(self, index: int, info: UpstreamInfo, clock: Clock, forward: Forward,
                 hand_back: HandBack) -> None:
        self.index = index
        self.role = info.spec.role
        self.info = info
        self.url = info.url
        self.kind = info.kind
        self.models = info.models
        self.max_num_seqs = info.spec.max_num_seqs
        self._clock = clock
        self._forward = forward
        self._hand_back = hand_back
        self.up = True
        self.polled = UpstreamLoad()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.requests: dict[str, Request] = {}
        self.started: set[str] = set()  # in flight, with a byte streamed to the client
        self.num_received = 0
        self.service_s = INITIAL_SERVICE_S
        self.num_failed_probes = 0
        self.num_finished_since_poll = 0

    # ---- the Instance seam ----------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.up

    def submit(self, req: Request) -> None:
        self.num_received += 1
        rid = req.request_id
        self.requests[rid] = req
        task = asyncio.get_running_loop().create_task(self._forward(self, req),
                                                      name=f"upstream-{self.index}-{rid}")
        self.tasks[rid] = task
        task.add_done_callback(lambda _: self._forget(rid, task))

    def abort(self, request_id: str) -> None:
        task = self.tasks.get(request_id)
        if task is not None:
            task.cancel()

    def withdraw(self, request_ids: Sequence[str]) -> None:
        back = []
        for rid in request_ids:
            if rid in self.tasks and rid not in self.started:
                self.tasks[rid].cancel()
                back.append(self.requests[rid])
        if back:
            asyncio.get_running_loop().call_soon(self._hand_back, self.index, back)

    def load(self) -> LoadReport:
        stats = self.stats()
        drain = self.service_s * (1.0 + stats.num_requests / self.max_num_seqs)
        return LoadReport(stats=stats, num_received=self.num_received,
                          drain_time=drain if stats.num_requests else 0.0)

    # ---- figures -------------------------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self.tasks)

    def observe_poll(self, load: UpstreamLoad) -> None:
        self.polled = load
        self.num_finished_since_poll = 0

    def stats(self) -> SchedulerStats:
        polled = self.polled
        own = len(self.tasks)
        started = len(self.started)
        gone = self.num_finished_since_poll  # of ours, ended since the poll counted them
        polled_running = max(0, (polled.num_running or 0) - gone)
        polled_total = max(0, polled_running + (polled.num_waiting or 0))
        total = max(polled_total, own)
        running = min(total, max(polled_running, started))
        kv = polled.kv_usage or 0.0
        return SchedulerStats(
            time=self._clock.now(), num_running=running, num_waiting=total - running,
            num_blocks=KV_SCALE, num_free_blocks=round((1.0 - kv) * KV_SCALE),
            max_num_seqs=self.max_num_seqs,
            num_prefilling=max(own - started, polled.num_waiting or 0))

    def observe_service(self, seconds: float) -> None:
        """A request through this upstream took `seconds` from send to its end."""
        self.service_s += SERVICE_EWMA * (seconds - self.service_s)

    def cancel_all(self, keep: asyncio.Task[None] | None = None) -> None:
        """Cancel every forwarding task but `keep` (the instance went down)."""
        for task in list(self.tasks.values()):
            if task is not keep:
                task.cancel()

    def _forget(self, rid: str, task: asyncio.Task[None]) -> None:
        if self.tasks.get(rid) is task:
            del self.tasks[rid]
            if rid in self.started:
                self.num_finished_since_poll += 1
            self.requests.pop(rid, None)
            self.started.discard(rid)
