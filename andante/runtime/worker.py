"""The instance worker: one engine stepped by one thread, talking in step messages.

Design note (DESIGN.md §4): the in-process backend (`LocalInstance`) and the Ray
backend (`RayInstance`) run the same worker; only the transport differs. Requests,
aborts and withdrawals arrive from the controller's thread through the worker's inbox
(the instance's only thread-safe one) and are applied at the next step boundary, in
order, by the thread that steps the engine. Each `step()` returns one `StepMessage`
carrying everything that step produced: the per-request outputs (the server's
detokenized deltas: all of the step's tokens), the requests that finished, the requests
handed back (withdrawn, or picked by a `HandsOff` policy such as Ascendra's LP offload)
and the instance's load report (the engine's `SchedulerStats` of the step plus the
cluster's figures). A Ray actor sends it back as one reply: one message per step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from andante.cluster.host import EngineHost
from andante.cluster.instance import Instance, ModelState
from andante.cluster.load import LoadReport
from andante.cluster.qlm.swap import ModelSwitcher
from andante.cluster.qlm.tiers import DISK, HOST, ModelSwap, ModelTiers
from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.engine import Engine, StepOutput
from andante.engine.stats import EngineLimits
from andante.perf.cost_model import CostModel

log = logging.getLogger("andante.cluster")


class OutputAdapter(Protocol):
    """Turns a step's output into what the front end streams (the server: `Delta`s).

    `register(req)` is called before the request is added (from the stepping thread);
    `stopped(step)` once per step names the requests whose text reached a stop string
    (the engine then finishes them); `outputs(step)` once per step; `discard(id)` when
    a request leaves the instance without finishing (handed back)."""

    def register(self, req: Request) -> None: ...

    def stopped(self, step: StepOutput) -> list[str]: ...

    def outputs(self, step: StepOutput) -> list[Any]: ...

    def discard(self, request_id: str) -> None: ...


class NoOutputs:
    """An adapter that streams nothing (tests, headless workers)."""

    def register(self, req: Request) -> None:
        return None

    def stopped(self, step: StepOutput) -> list[str]:
        return []

    def outputs(self, step: StepOutput) -> list[Any]:
        return []

    def discard(self, request_id: str) -> None:
        return None


@dataclass(frozen=True, slots=True)
class ModelReport:
    """Where a multi-model worker's models are now: the device model, the warm ones, a
    swap it has taken in (`pending`), the model it will swap to next (a pending swap or
    its parked head's) and each tier's bandwidth as measured by its swaps. Sent with
    every step message, so an instance in another process answers without a round trip."""

    device: str
    host: tuple[str, ...]
    pending: str | None = None
    next_model: str | None = None
    bandwidth: tuple[tuple[str, float], ...] = ()


def state_from(basis: ModelState, report: ModelReport) -> ModelState:
    """`basis` (the costs, weights' bytes and hardware of an instance's models) with the
    placement of `report`: the device is the model a pending swap brings in."""
    device = report.pending or report.device
    measured = dict(report.bandwidth)
    return replace(basis, device=device, host=tuple(m for m in report.host if m != device),
                   host_link_bandwidth=measured.get(HOST, basis.host_link_bandwidth),
                   disk_bandwidth=measured.get(DISK, basis.disk_bandwidth))


@dataclass(slots=True)
class StepMessage:
    """What instance `index` reports after one step (or an idle wake-up)."""

    index: int
    outputs: list[Any] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)
    handoffs: list[Request] = field(default_factory=list)
    load: LoadReport = field(default_factory=LoadReport)
    stepped: bool = False
    swaps: list[ModelSwap] = field(default_factory=list)
    models: ModelReport | None = None  # a multi-model worker's placement after the step


Post = Callable[[StepMessage], None]
OnChange = Callable[[int, BaseException | None], None]  # (instance index, the cause)
Build = Callable[[str, Any], tuple[Engine, OutputAdapter]]  # (model, weights) -> engine
Load = Callable[[str], Any]  # model name -> its weights read from disk (a cold load)
AtBoundary = Callable[["InstanceWorker"], None]  # run by the stepping thread, between steps
# run after each step (True: the step ran a batch); returns False once it has finished
BoundaryTask = Callable[[bool], bool]


@dataclass(slots=True)
class ModelSwitch:
    """A multi-model worker's models (`tiers`, holding the weights of the device and
    warm models), how it reads a model's weights from disk (`load`, any thread) and
    builds an engine over them, each model's cost model (for a router's estimates:
    QLM's §6 estimator) and, where known, each model's engine limits (what the server
    admits for it)."""

    tiers: ModelTiers
    build: Build
    load: Load
    costs: Mapping[str, CostModel]
    limits: Mapping[str, EngineLimits] = field(default_factory=dict)


class EngineLoop(Protocol):
    """Steps the engine in place of `Engine.step` (KunServe: a pipeline group's leader,
    andante.runtime.kunserve_loop). `has_work` counts work still in flight; `step_output`
    returns what completed (None: nothing did, e.g. a step only entered the pipeline)
    and whether a batch ran (entered, in flight or completed); `drain` completes what is
    in flight (its outputs come with the next `step_output`): the worker drains before
    an `at_boundary` operation, which may need the engine's executor idle (sleep mode,
    a group operation)."""

    @property
    def has_work(self) -> bool: ...

    def step_output(self) -> tuple[StepOutput | None, bool]: ...

    def drain(self) -> None: ...


class HostedInstance(Instance, Protocol):
    """An instance whose worker runs on a thread or in an actor. `start` once: each step
    message goes to `post`; `on_down` / `on_up` when it fails / comes back (restarted).
    `observe` keeps the message's load report (the runner's thread); `restartable`:
    it may still come back after going down."""

    @property
    def restartable(self) -> bool: ...

    def start(self, post: Post, on_down: OnChange, on_up: OnChange) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def observe(self, message: StepMessage) -> None: ...


class InstanceWorker:
    """One engine and its inbox. With a `ModelSwitch` it serves several models, one on
    the device at a time (QLM LSO 5): the swap is andante.cluster.qlm.swap's
    `ModelSwitcher` (a request for another model is parked until the engine is dry, or
    `swap_model` asks for it; the outgoing model's unfinished requests are handed back),
    driven here on the wall clock, this worker its `SwapSite`."""

    def __init__(self, index: int, engine: Engine, adapter: OutputAdapter | None = None,
                 drop_late: bool = False, model_name: str = "",
                 switch: ModelSwitch | None = None) -> None:
        self.index = index
        self.model_name = model_name
        self.engine = engine
        self.adapter = adapter or NoOutputs()
        self.drop_late = drop_late
        self.host = EngineHost(engine, drop_late)
        self.switch = switch
        self.switcher = None if switch is None else ModelSwitcher(switch.tiers, self)
        self._inbox: deque[tuple[str, Any]] = deque()  # appends are thread-safe
        self._wake = threading.Event()
        self._withdrawn: list[Request] = []
        self._aborted: list[Request] = []  # parked requests aborted before their engine
        self._swaps: list[ModelSwap] = []  # since the last message
        self._bandwidth: dict[str, float] = {}  # tier -> measured bytes/s of its swaps
        self._warming: set[str] = set()  # models being read into host memory
        self._init_grouping()

    def _init_grouping(self) -> None:
        """KunServe (andante.runtime.kunserve): while this worker's instance is a member
        of a pipeline group, requests reaching its inbox go on to the group's leader
        (`redirect`; aborts go where the controller placed the request: the leader, since
        the coordinator reassigned the member's requests); `_tasks` run between steps
        (the chunked KV exchange); `loop`, set on a group's leader, steps its engine
        (its microbatches overlap in the group's pipeline: andante.runtime.kunserve_loop)."""
        self.redirect: InstanceWorker | None = None
        self.loop: EngineLoop | None = None
        self._tasks: list[BoundaryTask] = []
        self._report_due = False

    # ---- any thread ---------------------------------------------------------------
    def submit(self, req: Request) -> None:
        self._post("add", req)

    def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        self._post("withdraw", list(request_ids))

    def evict(self, request_id: str, mode: PreemptionMode) -> None:
        """Preempt the running request at the next step (QLM's agent, LSOs 2-3)."""
        self._post("evict", (request_id, mode))

    def swap_model(self, model: str) -> None:
        """Serve `model` from the next step boundary (ValueError: not one of ours)."""
        if self.switch is None:
            raise ValueError(f"instance {self.index} serves one model only")
        self.switch.tiers.check(model)
        self._post("swap", model)

    def warm_model(self, model: str) -> None:
        if self.switch is not None:
            self.switch.tiers.check(model)
            self._post("warm", model)

    def at_boundary(self, operation: AtBoundary, first: bool = False) -> None:
        """Run `operation(self)` on the stepping thread at its next step boundary (in
        inbox order, or before everything waiting in the inbox if `first`): how a
        pipeline group forms and dissolves between steps."""
        if first:
            self._inbox.appendleft(("call", operation))
            self._wake.set()
        else:
            self._post("call", operation)

    def wake(self) -> None:
        self._wake.set()

    def _post(self, kind: str, item: Any) -> None:
        self._inbox.append((kind, item))
        self._wake.set()

    # ---- the stepping thread ------------------------------------------------------
    def step(self, timeout: float | None = None) -> StepMessage | None:
        """Apply the inbox, then run one engine step (and a model swap that is due);
        with no work, wait up to `timeout` for some. Returns the step's message, or
        None when nothing happened."""
        self._wake.clear()
        self._apply_inbox()
        idle = False
        if not self._has_work and not self._swap_due and not self._tasks:
            if timeout is not None and timeout > 0:
                idle = not self._wake.wait(timeout)
            self._apply_inbox()
        message = None
        ran_batch = False
        if self._has_work:
            out, ran_batch = self._step_engine()
            if out is not None:
                self.engine.finish_stopped(out, self.adapter.stopped(out))
                message = self._message(out, stepped=True)
        if self._tasks:
            self._run_tasks(ran_batch)
        if self._swap_due:
            self._swap_at_boundary()
        heartbeat = idle and self.switch is not None  # fresh time for a queue router
        report, self._report_due = self._report_due, False
        if message is None and (self._aborted or self._withdrawn or self._swaps or heartbeat
                                or report):
            message = self._message(None, stepped=False)
        if message is not None and self._swaps:
            message.swaps, self._swaps = self._swaps, []
            message.handoffs.extend(self._drain_handoffs())
            message.load = self.host.report()
        if message is not None and self.switch is not None:
            message.models = self.model_report()
        return message

    @property
    def _has_work(self) -> bool:
        return self.engine.has_work if self.loop is None else self.loop.has_work

    def _step_engine(self) -> tuple[StepOutput | None, bool]:
        if self.loop is not None:
            return self.loop.step_output()
        out = self.engine.step()
        return out, out.batch.num_seqs > 0

    def _run_tasks(self, ran_batch: bool) -> None:
        self._tasks = [task for task in self._tasks if task(ran_batch)]

    def report_soon(self) -> None:
        """Send a load report after the next boundary even if no step runs (the
        engine's blocks changed: a pipeline group formed or dissolved); any thread."""
        self._report_due = True
        self._wake.set()

    def add_task(self, task: BoundaryTask) -> None:
        """Run `task` after every step from now on until it returns False (stepping
        thread only: from an `at_boundary` operation)."""
        self._tasks.append(task)

    def _apply_inbox(self) -> None:
        inbox = self._inbox
        while inbox:
            kind, item = inbox.popleft()
            if kind == "add" and self.redirect is not None:
                self.redirect.submit(item)  # a group's member: its leader serves
                continue
            if kind == "call":
                if self.loop is not None:
                    self.loop.drain()  # the operation finds no microbatch in flight
                item(self)
            elif kind == "add":
                self._add(item)
            elif kind == "abort":
                self._abort(item)
            elif kind == "swap":
                assert self.switcher is not None
                self.switcher.ask(item)
            elif kind == "evict":
                self.engine.scheduler.request_preemption(*item)
            elif kind == "warm":
                self._start_warming(item)
            elif kind == "warmed":
                self._warmed(*item)
            else:
                self._withdrawn.extend(self.host.withdraw(item))
                if self.switcher is not None:
                    self._withdrawn.extend(self.switcher.unpark(item))

    def _add(self, req: Request) -> None:
        if self.switcher is not None and self.switcher.must_park(req):
            self.host.num_received += 1  # taken in; handed to the engine after a swap
            self.switcher.park(req)
            return
        self.adapter.register(req)
        self.host.add(req)  # a refused one comes with the engine's next output

    def _abort(self, request_id: str) -> None:
        parked = [] if self.switcher is None else self.switcher.unpark([request_id])
        for req in parked:
            req.finish(RequestStatus.FINISHED_ABORTED, self.engine.clock.now())
            self._aborted.append(req)  # reported as finished with the next message
        self.engine.abort(request_id)

    # ---- warm start (QLM LSO 5): read a checkpoint into host memory, off this thread
    def _start_warming(self, model: str) -> None:
        assert self.switch is not None
        if model in self._warming or self.switch.tiers.tier(model) != DISK:
            return
        self._warming.add(model)
        threading.Thread(target=self._read_warm, args=(model,), daemon=True,
                         name=f"andante-warm-{self.index}-{model}").start()

    def _read_warm(self, model: str) -> None:
        assert self.switch is not None
        try:
            weights = self.switch.load(model)
        except Exception:  # the model stays cold; a swap to it reads it again
            log.exception("instance %d: warming %s failed", self.index, model)
            weights = None
        self._post("warmed", (model, weights))

    def _warmed(self, model: str, weights: Any) -> None:
        assert self.switch is not None
        self._warming.discard(model)
        tiers = self.switch.tiers
        if weights is not None and tiers.tier(model) == DISK:
            kept = tiers.warm(model, self.engine.clock.now())
            if kept:
                tiers.weights[model] = weights
            log.info("instance %d: %s %s", self.index, model,
                     "is warm" if kept else "does not fit the host budget: stays cold")

    # ---- model swaps (QLM LSO 5): the switcher's steps, this worker's transport -------
    @property
    def _swap_due(self) -> bool:
        return self.switcher is not None and self.switcher.due

    def _swap_at_boundary(self) -> None:
        assert self.switcher is not None
        swap = self.switcher.at_boundary(self.engine.clock.now())
        if swap is None:
            return
        self._swaps.append(swap)
        log.info("instance %d swapped %s -> %s (%s start, %.3f s, %d request(s) handed back)",
                 self.index, swap.outgoing, swap.incoming, swap.tier, swap.seconds,
                 swap.num_evicted)

    def install(self, model: str, source: str) -> float:
        """(`SwapSite`) An engine for `model` over its weights (the host copy, or read
        from disk); returns the seconds it took, which measure the tier's bandwidth."""
        assert self.switch is not None
        switch, tiers = self.switch, self.switch.tiers
        start = time.perf_counter()
        for rid in self.engine.scheduler.requests:  # flushed: handed back
            self.adapter.discard(rid)
        weights = tiers.weights.get(model) if source == HOST else None
        if weights is None:
            weights = switch.load(model)
        engine, adapter = switch.build(model, weights)
        tiers.weights[model] = weights
        received = self.host.num_received
        self.engine, self.adapter, self.model_name = engine, adapter, model
        self.host = EngineHost(engine, self.drop_late)
        self.host.num_received = received
        seconds = time.perf_counter() - start
        self._bandwidth[source] = switch.costs[model].model.weight_bytes / max(seconds, 1e-6)
        return seconds

    def admit(self, req: Request) -> None:
        """(`SwapSite`) A parked request for the device model, to its engine."""
        self.adapter.register(req)
        self.host.num_received -= 1  # `add` counts it again
        self.host.add(req)  # a refused one comes with the engine's next output

    def hand_back(self, reqs: list[Request]) -> None:
        """(`SwapSite`) The flushed requests go back with the next message."""
        self._withdrawn.extend(reqs)

    def _drain_handoffs(self) -> list[Request]:
        handoffs, self._withdrawn = self._withdrawn, []
        return handoffs

    def _message(self, out: StepOutput | None, stepped: bool) -> StepMessage:
        finished = [] if out is None else out.finished
        if self._aborted:
            finished.extend(self._aborted)
            self._aborted = []
        handoffs = self._drain_handoffs()
        handoffs.extend(self.host.take_handoffs())
        for req in handoffs:
            self.adapter.discard(req.request_id)
        self.host.observe_finished(finished)
        outputs: list[Any] = [] if out is None else self.adapter.outputs(out)
        return StepMessage(self.index, outputs, [r.request_id for r in finished], handoffs,
                           self.host.report(), stepped)

    def load(self) -> LoadReport:
        """A report taken now (stepping thread, or while the worker is stopped)."""
        return self.host.report()

    @property
    def next_model(self) -> str | None:
        """The model this worker will swap to (a swap asked for, or its parked head's);
        read from any thread."""
        return None if self.switcher is None else self.switcher.next_model

    @property
    def device_model(self) -> str:
        """The model on the device (read from any thread)."""
        return self.model_name if self.switch is None else self.switch.tiers.device

    def models(self) -> tuple[str, tuple[str, ...]]:
        """The model on the device and the warm ones (a single model: nothing warm);
        read from any thread."""
        if self.switch is None:
            return self.model_name, ()
        tiers = self.switch.tiers
        return tiers.device, tuple(tiers.host.copy())  # copy: one atomic call

    def model_report(self) -> ModelReport:
        """Where the models are now (read from any thread)."""
        assert self.switch is not None
        tiers = self.switch.tiers
        assert self.switcher is not None
        return ModelReport(tiers.device, tuple(tiers.host.copy()), self.switcher.pending,
                           self.next_model, tuple(self._bandwidth.copy().items()))

    def model_basis(self) -> ModelState:
        """What a router needs to estimate serving each model here (QLM §6), with the
        hardware's tier bandwidths; `state_from` adds where the models are."""
        assert self.switch is not None
        tiers, costs = self.switch.tiers, self.switch.costs
        hw = costs[tiers.device].hardware
        return ModelState(
            device=tiers.device, host=(), loading_s=0.0, costs=costs,
            weight_bytes={m: c.model.weight_bytes for m, c in costs.items()},
            host_link_bandwidth=hw.host_link_bandwidth, disk_bandwidth=hw.disk_bandwidth,
            device_memory_bytes=hw.mem_capacity,
            host_memory_bytes=tiers.host_capacity_bytes or 0,
            block_size=self.engine.scheduler.config.block_size)

    def model_state(self) -> ModelState:
        """The models here and what a router needs to estimate serving them (QLM §6):
        tier bandwidths as measured by this worker's swaps, else the hardware's."""
        return state_from(self.model_basis(), self.model_report())

    def describe_models(self) -> tuple[dict[str, EngineLimits], ModelState]:
        """Each model's engine limits and the basis of `model_state` (multi-model)."""
        assert self.switch is not None
        return dict(self.switch.limits), self.model_basis()

    def describe(self) -> tuple[EngineLimits, str]:
        """What the engine could ever serve, and the model's name."""
        return self.engine.limits(), self.model_name

