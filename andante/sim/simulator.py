"""Discrete-event simulation of N engine instances behind a router.

Each instance is the real `Engine` (the engine's own `Scheduler`, block manager and
policy) over a `SimExecutor`; only time is simulated. An instance's step begins at
event time t (schedule + modeled execution) and its tokens land at t + duration,
when the STEP_DONE event applies them. Arrivals at one instant are all delivered
before an idle instance starts its next step (KICK sorts after ARRIVAL).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from andante.cluster.router import LoadReport, Router
from andante.core.clock import ManualClock
from andante.core.request import Request, RequestStatus
from andante.engine.decode_run import apply_decode_run, decode_run_limit
from andante.engine.engine import Engine
from andante.engine.scheduler import RequestRejected
from andante.exec.batch import StepBatch, StepResult
from andante.sim.events import EventKind, EventQueue


@dataclass(slots=True)
class InstanceStats:
    num_steps: int = 0
    busy_time: float = 0.0
    num_stalls: int = 0  # times it had work but the policy scheduled nothing


class SimInstance:
    def __init__(self, index: int, engine: Engine) -> None:
        self.index = index
        self.engine = engine
        self.stats = InstanceStats()
        self.in_flight: tuple[StepBatch, StepResult] | None = None
        self.in_decode_run = False  # applying a run of identical decode steps
        self.kick_pending = False

    @property
    def busy(self) -> bool:
        return self.in_flight is not None or self.in_decode_run

    def load_report(self) -> LoadReport:
        s = self.engine.scheduler
        return LoadReport(s.num_running, s.num_waiting, s.num_swapped, s.kv.usage)


@dataclass(slots=True)
class SimReport:
    finished: list[Request] = field(default_factory=list)
    unfinished: list[Request] = field(default_factory=list)
    end_time: float = 0.0
    instance_stats: list[InstanceStats] = field(default_factory=list)
    num_events: int = 0


class Simulator:
    """`decode_runs=True` applies runs of identical all-decode steps at once where that is
    provably the same as stepping (see andante.engine.decode_run); False steps always."""

    def __init__(
        self,
        instances: list[SimInstance],
        router: Router,
        clock: ManualClock,
        decode_runs: bool = True,
    ) -> None:
        if not instances:
            raise ValueError("a simulation needs at least one instance")
        self.instances = instances
        self.router = router
        self.clock = clock
        self.decode_runs = decode_runs
        self._events = EventQueue()
        self._report = SimReport()
        self._on_finish: Callable[[Request], None] | None = None
        self._next_arrival = math.inf
        self._until = math.inf

    def run(
        self,
        requests: Iterable[Request],
        until: float | None = None,
        on_finish: Callable[[Request], None] | None = None,
    ) -> SimReport:
        """Simulate until every request finished (or `until` seconds); requests must be
        sorted by arrival time."""
        self._on_finish = on_finish
        self._until = math.inf if until is None else until
        arrivals = iter(requests)
        self._push_next_arrival(arrivals)
        while self._events:
            event = self._events.pop()
            if until is not None and event.time > until:
                break
            self.clock.advance_to(event.time)
            self._report.num_events += 1
            if event.kind == EventKind.ARRIVAL:
                self._on_arrival(event.payload)
                self._push_next_arrival(arrivals)
            elif event.kind == EventKind.STEP_DONE:
                self._on_step_done(event.payload)
            else:
                event.payload.kick_pending = False
                self._start_step(event.payload)
        return self._close()

    def _push_next_arrival(self, arrivals: Iterator[Request]) -> None:
        req = next(arrivals, None)
        self._next_arrival = math.inf
        if req is not None:
            self._next_arrival = max(req.arrival_time, self.clock.now())
            self._events.push(self._next_arrival, EventKind.ARRIVAL, req)

    def _on_arrival(self, req: Request) -> None:
        loads = [inst.load_report() for inst in self.instances]
        inst = self.instances[self.router.route(req, loads)]
        try:
            inst.engine.add_request(req)
        except RequestRejected:
            req.finish(RequestStatus.FINISHED_REJECTED, self.clock.now())
            self._record_finished(req)
            return
        if not inst.busy and not inst.kick_pending:
            inst.kick_pending = True
            self._events.push(self.clock.now(), EventKind.KICK, inst)

    def _start_step(self, inst: SimInstance) -> None:
        if inst.busy or not inst.engine.has_work:
            return
        batch, result = inst.engine.begin_step()
        if batch.is_empty:
            inst.stats.num_stalls += 1
            return
        inst.in_flight = (batch, result)
        inst.stats.busy_time += result.duration
        self._events.push(self.clock.now() + result.duration, EventKind.STEP_DONE, inst)

    def _on_step_done(self, inst: SimInstance) -> None:
        if inst.in_decode_run:  # its tokens were recorded when the run was planned
            inst.in_decode_run = False
            self._start_step(inst)
            return
        assert inst.in_flight is not None
        batch, result = inst.in_flight
        inst.in_flight = None
        output = inst.engine.finish_step(batch, result)
        inst.stats.num_steps += 1
        for req in output.finished:
            self._record_finished(req)
        if not (self.decode_runs and not output.finished and self._decode_run(inst, batch)):
            self._start_step(inst)

    def _decode_run(self, inst: SimInstance, batch: StepBatch) -> bool:
        """Apply the identical decode steps that certainly follow `batch` before the next
        arrival; True if any were applied (the instance is then busy until they end)."""
        executor = inst.engine.executor
        durations_of = getattr(executor, "decode_run_durations", None)
        if durations_of is None:
            return False
        token_id: int = executor.token_id  # type: ignore[attr-defined]
        max_steps = decode_run_limit(inst.engine.scheduler, batch, token_id)
        if max_steps == 0:
            return False
        now = self.clock.now()
        horizon = min(self._next_arrival, self._until)
        times: list[float] = []
        t = now
        for duration in durations_of(batch, max_steps, horizon - now):
            t += duration
            if t >= self._next_arrival or t > self._until:
                break
            times.append(t)
        if not times:
            return False
        apply_decode_run(inst.engine.scheduler, batch, times, token_id)
        inst.stats.num_steps += len(times)
        inst.stats.busy_time += times[-1] - now
        inst.in_decode_run = True
        self._events.push(times[-1], EventKind.STEP_DONE, inst)
        return True

    def _record_finished(self, req: Request) -> None:
        self._report.finished.append(req)
        if self._on_finish is not None:
            self._on_finish(req)

    def _close(self) -> SimReport:
        report = self._report
        report.end_time = self.clock.now()
        for inst in self.instances:
            report.unfinished.extend(inst.engine.scheduler.requests.values())
            report.instance_stats.append(inst.stats)
        return report
