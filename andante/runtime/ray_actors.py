"""Ray actors as instances: the multi-node backend (optional extra `andante[ray]`).

Design note (DESIGN.md §4): one actor per instance runs the same
`InstanceWorker` as the in-process backend. A driver-side pump thread per instance
calls the actor's `step` in a loop; each call returns one `StepMessage`, so there is one
Ray message per engine step carrying all of that step's tokens. Requests, aborts and
withdrawals are fire-and-forget calls in the actor's single-threaded "control" group
(kept in order), while `step` runs in its own group, so a step waiting for work does not
block a new request. Actors ask for no CPU (`num_cpus=0`: a third actor on a two-core
machine would otherwise wait forever) and are restarted by Ray up to `max_restarts`
times. When a call fails with a `RayActorError`, the pump reports the instance down (the
controller re-queues its requests that have not streamed a token and fails the others),
waits until the restarted actor answers, and reports it up again; with no restart left
the instance stays down. A restarted actor starts empty; anything it still receives for
a request the controller has re-queued is discarded by the owner check upstream.

A multi-model actor (`RayMultiModelInstance`, QLM LSO 5) runs the same `InstanceWorker`
with its `ModelSwitch`: `swap_model` and `warm_model` are control calls, so the swap
itself (the outgoing model's requests handed back with the step message, the incoming
one loaded warm from host memory or cold from disk, timed) is the in-process one. The
driver answers `model_state` without a round trip: the costs and hardware are fetched
once, and every step message carries the worker's `ModelReport`; a swap asked for but
not yet reported counts as pending, so a router never sends a second one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from andante.cluster.instance import BASIC_CAPABILITIES, SWAP_MODEL, LaterOperations, ModelState
from andante.cluster.load import LoadReport
from andante.core.request import Request
from andante.engine.stats import EngineLimits
from andante.runtime.worker import (
    InstanceWorker,
    ModelReport,
    OnChange,
    Post,
    StepMessage,
    state_from,
)

log = logging.getLogger("andante.cluster")

WorkerFactory = Callable[[int], InstanceWorker]  # must be picklable (a top-level function)
IDLE_WAIT_S = 0.5
RESTART_POLL_S = 0.2


def init_ray(address: str = "local") -> None:
    """Start an embedded Ray ("local") or join a running cluster ("auto", "ray://...")."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return
    if address == "local":
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)


def _actor_class() -> Any:
    import ray

    @ray.remote(concurrency_groups={"control": 1, "step": 1})  # type: ignore[call-overload]
    class InstanceActor:
        def __init__(self, factory: WorkerFactory, index: int) -> None:
            self.worker = factory(index)

        @ray.method(concurrency_group="control")
        def ping(self) -> int:
            return os.getpid()

        @ray.method(concurrency_group="control")
        def describe(self) -> tuple[EngineLimits, str]:
            return self.worker.describe()

        @ray.method(concurrency_group="control")
        def submit(self, req: Request) -> None:
            self.worker.submit(req)

        @ray.method(concurrency_group="control")
        def abort(self, request_id: str) -> None:
            self.worker.abort(request_id)

        @ray.method(concurrency_group="control")
        def withdraw(self, request_ids: list[str]) -> None:
            self.worker.withdraw(request_ids)

        @ray.method(concurrency_group="control")
        def swap_model(self, model: str) -> None:
            self.worker.swap_model(model)

        @ray.method(concurrency_group="control")
        def warm_model(self, model: str) -> None:
            self.worker.warm_model(model)

        @ray.method(concurrency_group="control")
        def describe_models(self) -> tuple[dict[str, EngineLimits], ModelState]:
            return self.worker.describe_models()

        @ray.method(concurrency_group="step")
        def step(self, timeout: float) -> StepMessage | None:
            return self.worker.step(timeout)

    return InstanceActor


class RayInstance(LaterOperations):
    """An `Instance` whose engine lives in a Ray actor (see the module note)."""

    capabilities = BASIC_CAPABILITIES

    def __init__(self, index: int, factory: WorkerFactory, role: str = "",
                 max_restarts: int = 3, spread: bool = False) -> None:
        import ray

        self.index = index
        self.role = role
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": max_restarts,
                                   "max_task_retries": 0}
        if spread:  # a multi-node cluster: one instance per node where possible
            options["scheduling_strategy"] = "SPREAD"
        self.actor = _actor_class().options(**options).remote(factory, index)
        self._ray = ray
        self._report = LoadReport()
        self._up = True
        self.dead = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the Instance seam ----------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._up and not self.dead

    def submit(self, req: Request) -> None:
        self.actor.submit.remote(req)

    def abort(self, request_id: str) -> None:
        self.actor.abort.remote(request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        self.actor.withdraw.remote(list(request_ids))

    def load(self) -> LoadReport:
        return self._report

    @property
    def restartable(self) -> bool:
        return not self.dead

    def describe(self) -> tuple[EngineLimits, str]:
        """The actor's engine limits and model (waits for it to be built)."""
        result: tuple[EngineLimits, str] = self._ray.get(self.actor.describe.remote())
        return result

    def observe(self, message: StepMessage) -> None:
        self._report = message.load

    # ---- lifecycle (pump thread) ----------------------------------------------------
    def start(self, post: Post, on_down: OnChange, on_up: OnChange) -> None:
        if self._thread is not None:
            raise RuntimeError(f"instance {self.index} is already started")
        self._thread = threading.Thread(target=self._pump, args=(post, on_down, on_up),
                                        name=f"andante-ray-{self.index}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._ray.kill(self.actor, no_restart=True)

    def _pump(self, post: Post, on_down: OnChange, on_up: OnChange) -> None:
        errors = self._ray.exceptions
        while not self._stopping.is_set():
            try:
                message = self._ray.get(self.actor.step.remote(IDLE_WAIT_S))
            except errors.RayActorError as exc:
                self._up = False
                on_down(self.index, exc)
                if not self._await_restart():
                    self.dead = True
                    return
                self._report = LoadReport()
                self._up = True
                on_up(self.index, None)
                continue
            if message is not None:
                post(message)

    def _await_restart(self) -> bool:
        """Wait until the restarted actor answers; False if it is gone for good."""
        errors = self._ray.exceptions
        while not self._stopping.is_set():
            try:
                self._ray.get(self.actor.ping.remote())
                return True
            except errors.ActorDiedError:
                log.error("instance %d: its actor died with no restart left", self.index)
                return False
            except errors.RayActorError:
                time.sleep(RESTART_POLL_S)
        return False


class RayMultiModelInstance(RayInstance):
    """A Ray instance whose worker serves several models (see the module note): it swaps
    models (QLM LSO 5), warms them and reports them (`MultiModel`)."""

    capabilities = BASIC_CAPABILITIES | {SWAP_MODEL}

    def __init__(self, index: int, factory: WorkerFactory, role: str = "",
                 max_restarts: int = 3, spread: bool = False) -> None:
        super().__init__(index, factory, role, max_restarts, spread)
        self._basis: ModelState | None = None
        self._limits: dict[str, EngineLimits] = {}
        self._reported: ModelReport | None = None
        self._asked: str | None = None  # a swap sent, not yet seen in a report

    def describe_models(self) -> dict[str, EngineLimits]:
        """Each model's engine limits (waits for the actor to be built)."""
        self._fetch_basis()
        return dict(self._limits)

    def _fetch_basis(self) -> ModelState:
        if self._basis is None:
            self._limits, self._basis = self._ray.get(self.actor.describe_models.remote())
        return self._basis

    def swap_model(self, model: str) -> None:
        """Serve `model` from the actor's next step boundary."""
        known = self._fetch_basis().costs
        if model not in known:
            raise ValueError(f"unknown model {model!r}; this instance serves {list(known)}")
        self._asked = model
        self.actor.swap_model.remote(model)

    def warm_model(self, model: str) -> bool:
        """Load `model` into the actor's host memory ahead of need (warm start)."""
        self.actor.warm_model.remote(model)
        return True

    def observe(self, message: StepMessage) -> None:
        super().observe(message)
        report = message.models
        if report is not None:
            self._reported = report
            if self._asked in (report.device, report.pending):
                self._asked = None  # the actor has taken the swap in

    def _report_now(self) -> ModelReport:
        basis = self._fetch_basis()
        report = self._reported or ModelReport(basis.device, basis.host)
        if self._asked is not None:
            report = replace(report, pending=self._asked, next_model=self._asked)
        return report

    def model_state(self) -> ModelState:
        return state_from(self._fetch_basis(), self._report_now())

    def models(self) -> tuple[str, tuple[str, ...]]:
        """The model on the device and the warm ones (host memory), as last reported."""
        report = self._report_now()
        return report.device, report.host

    def device_model(self) -> str:
        return self._report_now().device

    def next_model(self) -> str | None:
        return self._report_now().next_model
