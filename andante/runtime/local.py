"""In-process instances: each engine stepped by its own thread (the embedded default).

A `LocalInstance` owns an `InstanceWorker` and the thread that steps it. After every
step the thread hands the step's `StepMessage` to `post` (the server schedules it on
its event loop, where the controller lives); when there is no work the thread sleeps on
the worker's wake-up event. If the engine raises, the instance is down for good: `on_down`
tells the controller, which re-queues or fails its requests.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from andante.cluster.instance import (
    BASIC_CAPABILITIES,
    EVICT,
    SWAP_MODEL,
    LaterOperations,
    ModelState,
)
from andante.cluster.load import LoadReport
from andante.core.request import PreemptionMode, Request
from andante.runtime.worker import InstanceWorker, OnChange, Post, StepMessage

log = logging.getLogger("andante.cluster")

IDLE_WAIT_S = 0.5


class LocalInstance(LaterOperations):
    capabilities = BASIC_CAPABILITIES | {EVICT}

    def __init__(self, worker: InstanceWorker, role: str = "") -> None:
        self.index = worker.index
        self.role = role
        self.worker = worker
        self._report = worker.load()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        # told (on the dying thread, before `on_down`) when the instance fails:
        # a KunServe pipeline group restores its other members
        self.failure_listeners: list[OnChange] = []
        self.group_leader: int | None = None  # set while in a KunServe pipeline group

    # ---- the Instance seam (controller thread) ------------------------------------
    @property
    def alive(self) -> bool:
        """Serving requests of its own: running, and not a KunServe group's member."""
        return self.running and self.group_leader in (None, self.index)

    @property
    def running(self) -> bool:
        """Its stepping thread runs (a group's member too)."""
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def submit(self, req: Request) -> None:
        self.worker.submit(req)

    def abort(self, request_id: str) -> None:
        self.worker.abort(request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        self.worker.withdraw(request_ids)

    def evict(self, request_id: str, mode: PreemptionMode) -> None:
        self.worker.evict(request_id, mode)

    def load(self) -> LoadReport:
        return self._report

    @property
    def restartable(self) -> bool:
        return False

    def observe(self, message: StepMessage) -> None:
        """Keep the latest report (called with each message, on the controller side)."""
        self._report = message.load

    # ---- lifecycle ----------------------------------------------------------------
    def start(self, post: Post, on_down: OnChange, on_up: OnChange | None = None) -> None:
        """Run the stepping thread (`on_up` is never called: it does not restart)."""
        if self._thread is not None:
            raise RuntimeError(f"instance {self.index} is already started")
        self._thread = threading.Thread(target=self._run, args=(post, on_down),
                                        name=f"andante-instance-{self.index}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.worker.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, post: Post, on_down: OnChange) -> None:
        try:
            while not self._stopping.is_set():
                message = self.worker.step(IDLE_WAIT_S)
                if message is not None:
                    post(message)
        except BaseException as exc:  # the engine is broken: this instance stays down
            log.exception("instance %d failed", self.index)
            self.error = exc
            for listener in list(self.failure_listeners):
                listener(self.index, exc)
            on_down(self.index, exc)


class MultiModelInstance(LocalInstance):
    """A local instance whose worker serves several models (a `ModelSwitch`): it swaps
    models (QLM LSO 5), warms them and reports them (`MultiModel`)."""

    capabilities = BASIC_CAPABILITIES | {EVICT, SWAP_MODEL}

    def __init__(self, worker: InstanceWorker, role: str = "") -> None:
        if worker.switch is None:
            raise ValueError(f"instance {worker.index}: its worker serves one model only")
        super().__init__(worker, role)

    def swap_model(self, model: str) -> None:
        """Serve `model` from the worker's next step boundary."""
        self.worker.swap_model(model)

    def warm_model(self, model: str) -> bool:
        """Load `model` into host memory ahead of need (warm start)."""
        self.worker.warm_model(model)
        return True

    def model_state(self) -> ModelState:
        return self.worker.model_state()

    def models(self) -> tuple[str, tuple[str, ...]]:
        """The model on the device and the warm ones (host memory)."""
        return self.worker.models()

    def device_model(self) -> str:
        return self.worker.device_model

    def next_model(self) -> str | None:
        return self.worker.next_model
