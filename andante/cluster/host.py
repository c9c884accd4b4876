"""What every instance does around its engine, in the thread that steps it.

`EngineHost` is shared by the simulator's `SimInstance` and the server's workers (local
thread or Ray actor): it adds requests (through `Engine.submit`, which refuses those that
can never fit), counts what it received (so the controller knows what is still in
transit), drops requests already past their TTFT SLO when asked to (Ascendra §6.3),
withdraws requests for the controller (migration, and the offloads a `HandsOff` policy
picks) and builds the load report from the engine's stats.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from andante.cluster.instance import HandsOff
from andante.cluster.load import DEFAULT_EXPECTED_OUTPUT, LoadReport, predicted_drain_time
from andante.core.request import Request, RequestStatus
from andante.engine.engine import Engine
from andante.metrics.stats import RunningMean
from andante.perf.cost_model import CostModel


class LateDropper:
    """Design note (Ascendra §6.3, serving under load spikes): when load exceeds
    capacity, a request still waiting past its TTFT SLO can no longer be good; serving it
    only delays the requests behind it. `drop(now)` aborts every request that is still
    WAITING (never scheduled) after arrival + slo.ttft. A heap by deadline keeps it
    O(log n) per request."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []
        self._seq = 0
        self.num_dropped = 0

    def watch(self, req: Request) -> None:
        if req.slo.ttft is not None:
            self._seq += 1
            heapq.heappush(self._heap, (req.arrival_time + req.slo.ttft, self._seq, req))

    @staticmethod
    def _droppable(req: Request, engine: Engine) -> bool:
        return (req.status == RequestStatus.WAITING and not req.output_token_ids
                and engine.scheduler.requests.get(req.request_id) is req)

    def next_deadline(self, engine: Engine) -> float:
        """The earliest deadline of a request that would be dropped then (inf: none)."""
        heap = self._heap
        while heap and not self._droppable(heap[0][2], engine):
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def drop(self, now: float, engine: Engine) -> list[Request]:
        heap, dropped = self._heap, []
        while heap and heap[0][0] < now:
            req = heapq.heappop(heap)[2]
            if self._droppable(req, engine):
                engine.scheduler.abort_request(req.request_id)
                dropped.append(req)
        self.num_dropped += len(dropped)
        return dropped


class EngineHost:
    def __init__(self, engine: Engine, drop_late: bool = False) -> None:
        self.engine = engine
        self.num_received = 0
        self.dropper = LateDropper() if drop_late else None
        self.outputs = RunningMean(DEFAULT_EXPECTED_OUTPUT)  # finished output lengths
        policy = engine.scheduler.policy
        self._handoffs = policy if isinstance(policy, HandsOff) else None

    def add(self, req: Request) -> bool:
        """Add now through `Engine.submit`; False if refused (the engine finished it as
        rejected and reports it, see `Engine.take_ended`)."""
        self.num_received += 1
        if not self.engine.submit(req):
            return False
        if self.dropper is not None:
            self.dropper.watch(req)
        return True

    def drop_late(self, now: float) -> list[Request]:
        return [] if self.dropper is None else self.dropper.drop(now, self.engine)

    def drop_horizon(self) -> float:
        """When the next late request would be dropped (inf: never)."""
        return math.inf if self.dropper is None else self.dropper.next_deadline(self.engine)

    def withdraw(self, request_ids: Iterable[str]) -> list[Request]:
        withdraw = self.engine.scheduler.withdraw
        return [req for rid in request_ids if (req := withdraw(rid)) is not None]

    def take_handoffs(self) -> list[Request]:
        """Withdraw the requests the policy picked to hand back (none for most)."""
        if self._handoffs is None:
            return []
        ids = self._handoffs.take_handoffs()
        return self.withdraw(ids) if ids else []

    def observe_finished(self, finished: Sequence[Request]) -> None:
        for req in finished:
            if req.num_output_tokens and req.status != RequestStatus.FINISHED_ABORTED:
                self.outputs.observe(req.num_output_tokens)

    @property
    def cost_model(self) -> CostModel | None:
        """The policy's refitted model when it keeps one, else the executor's."""
        perf = getattr(self.engine.scheduler.policy, "perf_model", None)
        model = getattr(perf, "cost_model", None)
        return model if isinstance(model, CostModel) else self.engine.executor.cost_model

    def prediction_error(self) -> float | None:
        perf = getattr(self.engine.scheduler.policy, "perf_model", None)
        error = getattr(perf, "error", None)
        return error if isinstance(error, float) else None

    def report(self) -> LoadReport:
        """The engine's stats now, with what the cluster side adds to them."""
        stats, cost = self.engine.stats(), self.cost_model
        drain = 0.0 if cost is None else predicted_drain_time(cost, stats, self.outputs.mean)
        return LoadReport(
            stats, self.num_received, drain,
            0 if self.dropper is None else self.dropper.num_dropped, self.prediction_error(),
        )
