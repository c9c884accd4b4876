"""Discrete-event simulation of N engine instances behind the cluster controller.

Each instance is the real `Engine` (the engine's own `Scheduler`, block manager and
policy) over a `SimExecutor`; the requests reach them through the real
`andante.cluster.Controller` and router; only time is simulated. An instance's step
begins at event time t (schedule + modeled execution) and its tokens land at
t + duration, when the STEP_DONE event applies them. Arrivals at one instant are all
delivered before an idle instance starts its next step (KICK sorts after ARRIVAL).
Requests an instance hands back (Ascendra's offloads) go to the controller at the start
of the step that picked them; late requests are dropped (if enabled) at step starts.
Runs of steps applied at once (andante.sim.decode_run, prefill_run, after_finish) end
before the next arrival, or with the step that straddles it where nothing the arrival
does can tell the difference (`Simulator._straddles`; a run of its own where the
engine's observers read each output's figures).

A served engine's front end (HTTP, tokenization, the hops to the engine and back,
andante.perf.frontend_log) is the profile's `frontend_in` and `frontend_out`: a request
reaches the controller `frontend_in` after its arrival (its `arrival_time` stays the
client's, as a server stamps it), and the report's `delivery_delay` tells the metrics to
read each token `frontend_out` after the engine emitted it. Both are 0 in every
built-in profile.
A served engine's wake-up (andante.perf.idle_wake) is the profile's `idle_wake`: an
instance that starts a step after running none for `idle_wake_after` seconds or more
(`SimInstance.wake_time`) takes that much longer over it; 0 in every built-in profile.

Multi-model instances (QLM §5): the swap itself is andante.cluster.qlm.swap's
`ModelSwitcher` (parking, flush, release), which a `SimInstance` drives on the simulated
clock: a `SWAP_MODEL` happens after the step in flight; the instance loads an engine
built for the incoming model (its block pool sized for that model's KV), its load time
modelled by the model tiers (andante.cluster.qlm.tiers), and starts no step until the
weights have loaded.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol, runtime_checkable

from andante.cluster.controller import Controller
from andante.cluster.host import EngineHost
from andante.cluster.instance import (
    BASIC_CAPABILITIES,
    EVICT,
    SWAP_MODEL,
    HandsOff,
    LaterOperations,
    ModelState,
)
from andante.cluster.load import LoadReport
from andante.cluster.qlm.swap import ModelSwitcher
from andante.cluster.qlm.tiers import ModelSwap, ModelTiers
from andante.core.clock import ManualClock
from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.engine import Engine, StepOutput
from andante.engine.fast_path import SimFastPath
from andante.engine.policy import BasePolicy
from andante.engine.stopping import num_tokens_before_length_stop
from andante.exec.base import DecodeRunExecutor
from andante.exec.batch import StepBatch, StepResult
from andante.exec.sim_executor import SimExecutor
from andante.perf.catalog import get_model
from andante.perf.cost_model import CostModel
from andante.sim.after_finish import batch_after_finish
from andante.sim.decode_run import decode_run_limit, fit_blocks, reserve_blocks
from andante.sim.events import EventKind, EventQueue
from andante.sim.prefill_run import (
    fit_prefill_blocks,
    prefill_run_chunks,
    prefill_run_shapes,
    record_prefill_run,
    reserve_prefill_blocks,
    steps_within_limit,
)

# Builds the engine (and its decode-run executor) of one model on an instance.
EngineLoader = Callable[[str], tuple[Engine, DecodeRunExecutor | None]]


@dataclass(slots=True)
class InstanceStats:
    num_steps: int = 0
    busy_time: float = 0.0


class SimHooks:
    """What a `SimInstance` tells the simulator (set by `Simulator.__init__`)."""

    def wake(self, inst: SimInstance) -> None: ...

    def finished(self, inst: SimInstance, reqs: Sequence[Request]) -> None: ...

    def handoff(self, inst: SimInstance, reqs: Sequence[Request]) -> None: ...

    def wake_at(self, inst: SimInstance, when: float) -> None: ...

    def step_done_at(self, inst: SimInstance, when: float) -> None:
        """Part of a step completes at `when` (a pipeline's microbatch, besides the
        completion its `begin_step` returns)."""


class SimInstance(LaterOperations):
    """An `andante.cluster.Instance` on the simulated clock. `runs`: the engine's
    executor where it offers decode runs (None: the instance always steps). With
    `serve_models` it serves several models, one at a time (`swap_model`): it is then the
    `SwapSite` of its `switcher` (andante.cluster.qlm.swap)."""

    capabilities = BASIC_CAPABILITIES | {EVICT}

    def __init__(self, index: int, engine: Engine, runs: DecodeRunExecutor | None = None,
                 role: str = "", drop_late: bool = False) -> None:
        self.index = index
        self.engine = engine
        self.runs = runs
        self.role = role
        self.host = EngineHost(engine, drop_late)
        self.stats = InstanceStats()
        self.in_flight: tuple[StepBatch, StepResult] | None = None
        # batch, end times, durations, token, start, prefill chunks ([]: a decode run)
        self.decode_run: tuple[StepBatch, list[float], list[float], int, float,
                               list[int]] | None = None
        self.kick_pending = False
        self.hooks = SimHooks()
        self._report: tuple[tuple[float, int, int, int, int], LoadReport] | None = None
        self._fast: tuple[object, SimFastPath | None] = (None, None)  # see `fast_path`
        self.last_step_end = engine.clock.now()  # idle from here until a step starts
        self._init_models()

    def _init_models(self) -> None:
        self.tiers: ModelTiers | None = None
        self.switcher: ModelSwitcher | None = None
        self.loader: EngineLoader | None = None
        self.loading_until = -math.inf
        self.drop_late = False
        self._cost_models: dict[str, CostModel] = {}

    def configure(self, role: str, drop_late: bool) -> None:
        self.role = role
        self.drop_late = drop_late
        self.host = EngineHost(self.engine, drop_late)

    def serve_models(self, tiers: ModelTiers, loader: EngineLoader) -> None:
        """Serve every model of `tiers` (the engine built so far serves `tiers.device`)."""
        self.tiers, self.loader = tiers, loader
        self.switcher = ModelSwitcher(tiers, self)
        self.capabilities = BASIC_CAPABILITIES | {EVICT, SWAP_MODEL}

    @property
    def parked(self) -> Sequence[Request]:
        """Requests waiting here for their model (FCFS)."""
        return () if self.switcher is None else self.switcher.parked

    @property
    def swaps(self) -> list[ModelSwap]:
        return [] if self.switcher is None else self.switcher.swaps

    @property
    def model(self) -> str | None:
        """The model on the device (None: a single-model instance)."""
        return None if self.tiers is None else self.tiers.device

    # ---- the Instance seam ----------------------------------------------------------
    @property
    def alive(self) -> bool:
        return True

    def submit(self, req: Request) -> None:
        if self.tiers is not None and req.model and req.model not in self.tiers.weight_bytes:
            held = ", ".join(sorted(self.tiers.weight_bytes))
            req.reject(f"model {req.model!r} is not served by instance {self.index} "
                       f"(it holds {held})", self.engine.clock.now())
            self.host.num_received += 1
            self.hooks.finished(self, [req])
            return
        if self.switcher is not None and self.switcher.must_park(req):
            self.switcher.park(req)
            self.host.num_received += 1  # taken in; handed to the engine later
            self.swap_when_dry()
            return
        self._add(req)

    def _add(self, req: Request) -> None:
        if self.host.add(req):
            self.hooks.wake(self)
        else:  # refused: reported now, so the engine's next output does not repeat it
            self.hooks.finished(self, self.engine.take_ended())

    def abort(self, request_id: str) -> None:
        req = self.engine.scheduler.abort_request(request_id)  # at once: one thread here
        if req is None:
            parked = [] if self.switcher is None else self.switcher.unpark([request_id])
            if not parked:
                return
            req = parked[0]
            req.finish(RequestStatus.FINISHED_ABORTED, self.engine.clock.now())
        self.hooks.finished(self, [req])

    def withdraw(self, request_ids: Sequence[str]) -> None:
        reqs = self.host.withdraw(request_ids)
        if self.switcher is not None:
            reqs += self.switcher.unpark(request_ids)
        if reqs:
            self.hooks.handoff(self, reqs)

    def evict(self, request_id: str, mode: PreemptionMode) -> None:
        """Preempt the running request at the next step (QLM's agent, LSOs 2-3)."""
        self.engine.scheduler.request_preemption(request_id, mode)
        self.hooks.wake(self)

    def load(self) -> LoadReport:
        """Computed on demand (and cached until the instance's state changes)."""
        now = self.engine.clock.now()
        key = (now, self.stats.num_steps, self.host.num_received,
               len(self.engine.scheduler.requests),
               0 if self.switcher is None else len(self.switcher.swaps))
        if self._report is None or self._report[0] != key:
            self._report = (key, self.host.report())
        return self._report[1]

    # ---- model swaps (QLM LSO 5) --------------------------------------------------------
    def swap_model(self, model: str) -> None:
        """Serve `model` next: at once when no step is in flight, else after it."""
        if self.switcher is None:
            super().swap_model(model)
            return
        self.switcher.ask(model)  # a ValueError naming the known models
        if self.in_flight is None and self.decode_run is None:
            self._swap_due()

    def warm_model(self, model: str) -> bool:
        """Start loading `model` into host memory ahead of need (warm start)."""
        return self.tiers is not None and self.tiers.warm(model, self.engine.clock.now())

    def model_state(self) -> ModelState:
        """The models here (a single-model instance: its engine's, nothing warm)."""
        now, cost = self.engine.clock.now(), self.engine.executor.cost_model
        hw, tiers = cost.hardware, self.tiers
        host = () if tiers is None else tuple(tiers.host)
        models = {cost.model.name: cost.model.weight_bytes} if tiers is None \
            else dict(tiers.weight_bytes)
        costs = {m: (cost if m == cost.model.name else self._costs(m)) for m in models}
        pending = None if self.switcher is None else self.switcher.pending
        return ModelState(
            device=pending or cost.model.name, host=host,
            loading_s=max(0.0, self.loading_until - now), costs=costs, weight_bytes=models,
            host_link_bandwidth=hw.host_link_bandwidth * cost.tp,
            disk_bandwidth=hw.disk_bandwidth, device_memory_bytes=hw.mem_capacity * cost.tp,
            host_memory_bytes=0 if tiers is None else tiers.host_capacity_bytes or 0,
            block_size=self.engine.scheduler.config.block_size)

    def _costs(self, model: str) -> CostModel:
        cached = self._cost_models.get(model)
        if cached is None:
            base = self.engine.executor.cost_model
            cached = CostModel(get_model(model), base.hardware, tp=base.tp)
            self._cost_models[model] = cached
        return cached

    @property
    def num_unfinished(self) -> int:
        return len(self.engine.scheduler.requests) + len(self.parked)

    def at_step_boundary(self) -> None:
        """After a step: a requested swap happens now; else parked requests may swap."""
        assert self.switcher is not None
        if self.switcher.pending is not None or not self.busy:
            self._swap_due()

    def swap_when_dry(self) -> None:
        if not self.busy:
            self._swap_due()

    def _swap_due(self) -> None:
        """The swap that is due now (andante.cluster.qlm.swap); the instance starts
        its next step once the weights have loaded."""
        assert self.switcher is not None
        if self.switcher.at_boundary(self.engine.clock.now()) is not None:
            self.hooks.wake_at(self, self.loading_until)

    # ---- the SwapSite of the switcher ---------------------------------------------------
    def install(self, model: str, source: str) -> float:
        """Build the engine of `model`; its weights take the modelled load time."""
        assert self.tiers is not None and self.loader is not None
        now = self.engine.clock.now()
        seconds = self.tiers.load_time(model, now)
        received = self.host.num_received
        self.engine, self.runs = self.loader(model)
        self.host = EngineHost(self.engine, self.drop_late)
        self.host.num_received = received
        self.loading_until = now + seconds
        return seconds

    def admit(self, req: Request) -> None:
        self.host.num_received -= 1  # counted when parked; `_add` counts it again
        self._add(req)

    def hand_back(self, reqs: list[Request]) -> None:
        self.hooks.handoff(self, reqs)

    # ---- stepping -------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return (self.in_flight is not None or self.decode_run is not None
                or self.loading_until > self.engine.clock.now())

    def begin_step(self, now: float) -> float | None:
        """Schedule and start a step; returns when it completes (None if nothing ran)."""
        batch, result = self.engine.begin_step()
        if batch.is_empty:
            ended = self.engine.take_ended()  # refused at a stall (andante.engine.stall)
            if ended:
                self.hooks.finished(self, ended)
            return None
        result.duration += self.wake_time(now)
        self.in_flight = (batch, result)
        self.stats.busy_time += result.duration
        return now + result.duration

    def wake_time(self, now: float) -> float:
        """The engine's wake-up, for a step starting `now`, where the instance ran no
        step since `last_step_end` (HardwareSpec.idle_wake, andante.perf.idle_wake; 0
        in every built-in profile). Steps that follow another at once (and the runs of
        andante.sim.decode_run and prefill_run, which start only as a step ends) pay
        none."""
        idle_for = now - self.last_step_end
        return self.engine.executor.cost_model.wake_time(idle_for) if idle_for > 0 else 0.0

    def fast_path(self) -> SimFastPath | None:
        """The engine's policy where it implements the simulator's fast paths
        (andante.engine.fast_path); None: every step is simulated. Checked once per
        engine (a model swap builds another)."""
        policy = self.engine.scheduler.policy
        if self._fast[0] is not policy:
            self._fast = (policy, policy if isinstance(policy, SimFastPath) else None)
        return self._fast[1]

    def begin_decode_run(self, runs: DecodeRunExecutor, batch: StepBatch,
                         times: list[float], durations: list[float]) -> None:
        """Start the run of identical decode steps of `batch` ending at `times` (each
        lasting `durations`, andante.sim.decode_run): their blocks now, their tokens
        when it ends."""
        reserve_blocks(self.engine.scheduler, batch, len(times))
        self._begin_run(batch, times, durations, runs.token_id, [])

    def begin_prefill_run(self, runs: DecodeRunExecutor, batch: StepBatch,
                          times: list[float], durations: list[float],
                          chunks: list[int]) -> None:
        """Start the run of steps following `batch` that prefill `chunks` of the last
        running request beside the others' decodes (andante.sim.prefill_run)."""
        reserve_prefill_blocks(self.engine.scheduler, self.engine.scheduler.running, chunks)
        self._begin_run(batch, times, durations, runs.token_id, chunks)

    def _begin_run(self, batch: StepBatch, times: list[float], durations: list[float],
                   token_id: int, chunks: list[int]) -> None:
        now = self.engine.clock.now()
        self.decode_run = (batch, times, durations, token_id, now, chunks)
        self.stats.num_steps += len(times)
        self.stats.busy_time += times[-1] - now

    def finish_step(self) -> tuple[StepBatch, StepOutput]:
        """Apply the step (or decode run) in flight that completes now (the earliest one
        started)."""
        self.last_step_end = self.engine.clock.now()
        if self.decode_run is not None:
            return self._finish_decode_run(*self.decode_run)
        assert self.in_flight is not None
        batch, result = self.in_flight
        self.in_flight = None
        output = self.engine.finish_step(batch, result)
        self.stats.num_steps += 1
        return batch, output

    def _finish_decode_run(self, batch: StepBatch, times: list[float],
                           durations: list[float], token_id: int, start: float,
                           chunks: list[int]) -> tuple[StepBatch, StepOutput]:
        self.decode_run = None
        requests, engine, fast = batch.requests, self.engine, self.fast_path()
        assert fast is not None  # (a run began: the policy offers runs)
        if chunks:
            got = record_prefill_run(engine.scheduler, engine.scheduler.running, chunks,
                                     token_id, times)
            fast.on_prefill_run(batch, chunks, times, durations)
        else:
            got = engine.scheduler.record_tokens(requests, repeat(len(times)),
                                                 repeat(token_id), *times)
            fast.on_decode_run(batch, durations)
        result = StepResult([token_id] * len(requests), times[-1] - start)
        output = StepOutput(batch, result, got, [r for r in got if r.is_finished], len(times))
        engine.notify(output)
        return batch, output

    def next_start_time(self) -> float | None:
        """When another step may start before the ones in flight complete (pipeline
        parallelism, see andante.sim.pipeline); None: only once they complete."""
        return None


@runtime_checkable
class Counted(Protocol):
    """A router's counters for the report (QLM: plans, EDF fallbacks, swaps)."""

    def summary(self) -> dict[str, int]: ...


@dataclass(slots=True)
class SimReport:
    finished: list[Request] = field(default_factory=list)
    unfinished: list[Request] = field(default_factory=list)
    num_stalls: int = 0  # requests refused because an instance stalled (engine.stall)
    end_time: float = 0.0
    instance_stats: list[InstanceStats] = field(default_factory=list)
    model_swaps: list[ModelSwap] = field(default_factory=list)
    router_counters: dict[str, int] = field(default_factory=dict)  # e.g. QLM's plans
    # the front end's seconds from a token's emission to the client (`Simulator`): the
    # metrics read each token this much later (andante.metrics.record)
    delivery_delay: float = 0.0


class Simulator(SimHooks):
    """`decode_runs=True` applies runs of identical all-decode steps at once where that is
    provably the same as stepping (see andante.sim.decode_run); False steps always."""

    def __init__(
        self,
        instances: list[SimInstance],
        controller: Controller,
        clock: ManualClock,
        decode_runs: bool = True,
    ) -> None:
        if not instances:
            raise ValueError("a simulation needs at least one instance")
        if [s.instance for s in controller.slots] != instances:
            raise ValueError("the controller must drive exactly the simulated instances")
        self.instances = instances
        self.controller = controller
        self.clock = clock
        self.decode_runs = decode_runs
        self._events = EventQueue()
        self._report = SimReport()
        self._on_finish: Callable[[Request], None] | None = None
        self._keep_finished = True
        self._next_arrival = math.inf
        self._until = math.inf
        self._stop_at = math.inf
        self._hands_off = False  # does a policy hand requests back (set by `run`)?
        for inst in instances:
            inst.hooks = self
        # one HTTP front end serves the cluster (DESIGN.md §2.6): its time before and
        # after the engines, the largest any instance's profile gives (0: none)
        profiles = [inst.engine.executor.cost_model.hardware for inst in instances
                    if isinstance(inst.engine.executor, SimExecutor)]
        self.frontend_in = max((hw.frontend_in for hw in profiles), default=0.0)
        self._report.delivery_delay = max((hw.frontend_out for hw in profiles), default=0.0)

    @property
    def delivery_delay(self) -> float:
        """Seconds from a token's emission to its client (`SimReport.delivery_delay`)."""
        return self._report.delivery_delay

    def run(
        self,
        requests: Iterable[Request],
        until: float | None = None,
        on_finish: Callable[[Request], None] | None = None,
        keep_finished: bool = True,
    ) -> SimReport:
        """Simulate until every request finished (or `until` seconds); requests must be
        sorted by arrival time. keep_finished=False leaves finished requests out of the
        report (`on_finish` still sees each), so memory does not grow with the run."""
        self._on_finish = on_finish
        self._keep_finished = keep_finished
        self._hands_off = len(self.instances) > 1 and any(  # to another instance
            isinstance(inst.engine.scheduler.policy, HandsOff) for inst in self.instances)
        self._until = math.inf if until is None else until
        arrivals = iter(requests)
        self._push_next_arrival(arrivals)
        while self._events:
            event = self._events.pop()
            if until is not None and event.time > until:
                break
            self.clock.advance_to(event.time)
            if event.kind == EventKind.ARRIVAL:
                self.controller.submit(event.payload)
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
            self._next_arrival = max(req.arrival_time + self.frontend_in, self.clock.now())
            self._events.push(self._next_arrival, EventKind.ARRIVAL, req)

    # ---- hooks (SimHooks) -------------------------------------------------------------
    def wake(self, inst: SimInstance) -> None:
        if not inst.busy and not inst.kick_pending:
            inst.kick_pending = True
            self._events.push(self.clock.now(), EventKind.KICK, inst)

    def finished(self, inst: SimInstance, reqs: Sequence[Request]) -> None:
        controller = self.controller
        for req in reqs:
            if self._keep_finished:
                self._report.finished.append(req)
            controller.on_finished(req.request_id)
            if self._on_finish is not None:
                self._on_finish(req)
        inst.host.observe_finished(reqs)

    def handoff(self, inst: SimInstance, reqs: Sequence[Request]) -> None:
        self.controller.on_handoff(inst.index, reqs)

    def wake_at(self, inst: SimInstance, when: float) -> None:
        self._events.push(max(when, self.clock.now()), EventKind.KICK, inst)

    def step_done_at(self, inst: SimInstance, when: float) -> None:
        self._events.push(when, EventKind.STEP_DONE, inst)

    # ---- stepping ---------------------------------------------------------------------
    def _start_step(self, inst: SimInstance) -> None:
        if inst.busy:
            return
        now = self.clock.now()
        if inst.host.dropper is not None:
            dropped = inst.host.drop_late(now)
            if dropped:
                self.finished(inst, dropped)
        if not inst.engine.has_work:
            if inst.parked:
                inst.swap_when_dry()
            elif self.controller.holds_queue and self.controller.queue:
                self.controller.dispatch_queue()  # an idle instance may pull or swap now
            return
        done = inst.begin_step(now)
        handoffs = inst.host.take_handoffs()
        if handoffs:
            self.handoff(inst, handoffs)
        if done is None:
            return
        self._events.push(done, EventKind.STEP_DONE, inst)
        wake = inst.next_start_time()
        if wake is not None and not inst.kick_pending:
            inst.kick_pending = True
            self._events.push(wake, EventKind.KICK, inst)

    def _on_step_done(self, inst: SimInstance) -> None:
        batch, output = inst.finish_step()
        if output.finished:
            self.finished(inst, output.finished)
        if self.controller.queue:
            self.controller.dispatch_queue()
        if self.controller.operators:
            self.controller.after_step()
        if inst.tiers is not None:
            inst.at_step_boundary()
            if inst.busy:
                return
        if not (self.decode_runs and self._run_next(inst, batch, bool(output.finished))):
            self._start_step(inst)

    def _run_next(self, inst: SimInstance, batch: StepBatch, finished: bool) -> bool:
        """Start the run of steps certain to follow `batch` (just applied), if any: only
        where the instance's executor and its policy offer runs
        (andante.engine.fast_path)."""
        fast = inst.fast_path()
        if inst.runs is None or fast is None:
            return False
        if not finished and self._decode_run(inst, fast, batch):
            return True
        if not self._only_arrivals_add():
            return False
        if not finished and self._prefill_run(inst, fast, batch):
            return True
        # a finish, or prefills that completed: all that runs may now be decodes
        after = batch_after_finish(inst.engine.scheduler, fast)
        return after is not None and self._decode_run(inst, fast, after, next_batch=True)

    def _decode_run(self, inst: SimInstance, fast: SimFastPath, batch: StepBatch,
                    next_batch: bool = False) -> bool:
        """Apply the identical decode steps that certainly follow `batch` (just applied;
        `next_batch`: the batch of the next step, andante.sim.after_finish) before the
        next arrival (or late drop); True if any were applied (the instance is then busy
        until they end)."""
        executor, scheduler = inst.runs, inst.engine.scheduler
        if executor is None:
            return False
        max_steps = num_tokens_before_length_stop(batch.requests, scheduler.max_num_tokens) \
            if next_batch else decode_run_limit(scheduler, fast, batch)
        if fast.run_max_steps < max_steps:
            max_steps = int(fast.run_max_steps)
        if max_steps <= 0:
            return False
        now = self.clock.now()
        stop_at = self._run_horizon(inst)
        self._stop_at = stop_at
        durations = executor.decode_run_durations(batch, max_steps,
                                                  min(stop_at, self._until) - now)
        times = self._run_times(durations, inst)
        if not next_batch:
            del times[steps_within_limit(durations, fast.run_step_limit):]
        if fast.run_until < math.inf:
            del times[bisect_left(times, fast.run_until):]
        del times[fit_blocks(scheduler, batch, len(times), fast.decode_run_reserve_blocks):]
        if not times:
            return False
        inst.begin_decode_run(executor, batch, times, durations[:len(times)])
        self._events.push(times[-1], EventKind.STEP_DONE, inst)
        return True

    def _run_horizon(self, inst: SimInstance) -> float:
        """Where a run of `inst` must stop: the next arrival, its late drop, and where an
        instance hands requests back (Ascendra's offload) the next event of any other
        instance, whose step start may hand this one a request amid the run."""
        stop_at = self._next_arrival
        if inst.host.dropper is not None:
            stop_at = min(stop_at, inst.host.drop_horizon())
        if self._hands_off:
            stop_at = min(stop_at, self._events.next_time())
        return stop_at

    def _only_arrivals_add(self) -> bool:
        """Can requests reach an instance only at arrivals (which end runs)? Not where
        the controller keeps a queue or operators, or an instance hands requests back
        (they reach another instance at its step start, maybe amid a run)."""
        controller = self.controller
        if controller.holds_queue or controller.queue or controller.operators:
            return False
        return not self._hands_off

    def _straddles(self, inst: SimInstance) -> bool:
        """May a run hold the step that starts before the next arrival and ends after
        it? That step is decided before the arrival, as when stepping, so it needs no
        decision where the arrival neither reads nor changes what the run's replay does
        (after the arrival here, at the step's start and end when stepping): one
        instance, so no router reads its load; no late drop (`_stop_at` is the
        arrival); and a policy whose `on_arrival` commutes with its run replays
        (`arrivals_commute_with_runs`, or none of its own)."""
        if len(self.instances) > 1 or inst.host.dropper is not None:
            return False
        policy, fast = inst.engine.scheduler.policy, inst.fast_path()
        commutes = type(policy).on_arrival is BasePolicy.on_arrival or (
            fast is not None and fast.arrivals_commute_with_runs)
        return commutes and self._only_arrivals_add()

    def _run_times(self, durations: list[float], inst: SimInstance) -> list[float]:
        """The end times of the steps lasting `durations` from now that end before the
        next arrival (or late drop, `_stop_at`) and `until`, and the step that ends after
        the arrival where `inst`'s runs may hold it (`_straddles`): the run's last step;
        or, where the engine has observers, its only one, so that the steps before the
        arrival are applied before it and each output's figures (its queues) are those
        stepping shows."""
        t, stop_at, until = self.clock.now(), self._stop_at, self._until
        straddle = self._straddles(inst)
        alone = straddle and inst.engine.has_observers
        times: list[float] = []
        for duration in durations:
            t += duration
            if t > until:
                break
            if t >= stop_at:
                if straddle and not (alone and times):
                    times.append(t)
                break
            times.append(t)
        return times

    def _prefill_run(self, inst: SimInstance, fast: SimFastPath, batch: StepBatch) -> bool:
        """Apply the steps of a chunked prefill beside decodes that certainly follow
        `batch` (andante.sim.prefill_run); True if any were applied."""
        executor, scheduler = inst.runs, inst.engine.scheduler
        if executor is None:
            return False
        chunks = prefill_run_chunks(scheduler, fast, batch)
        if not chunks:
            return False
        self._stop_at = self._run_horizon(inst)
        budget = min(self._stop_at, self._until) - self.clock.now()
        shapes = prefill_run_shapes(scheduler.running, chunks)
        durations = executor.prefill_run_durations(shapes, budget)
        times = self._run_times(durations, inst)
        del times[steps_within_limit(durations, fast.run_step_limit):]
        del times[fit_prefill_blocks(scheduler, chunks[:len(times)],
                                     fast.decode_run_reserve_blocks):]
        if not times:
            return False
        inst.begin_prefill_run(executor, batch, times, durations[:len(times)],
                               chunks[:len(times)])
        self._events.push(times[-1], EventKind.STEP_DONE, inst)
        return True

    def _close(self) -> SimReport:
        report = self._report
        report.end_time = self.clock.now()
        for inst in self.instances:
            report.unfinished.extend(inst.engine.scheduler.requests.values())
            report.unfinished.extend(inst.parked)
            report.model_swaps.extend(inst.swaps)
            report.instance_stats.append(inst.stats)
            report.num_stalls += inst.engine.num_stalls
        report.unfinished.extend(self.controller.queue)
        counters = getattr(self.controller.router, "counters", None)
        if isinstance(counters, Counted):
            report.router_counters = counters.summary()
        return report
