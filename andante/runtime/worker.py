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

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from andante.cluster.host import EngineHost
from andante.cluster.instance import Instance
from andante.cluster.load import LoadReport
from andante.core.request import Request
from andante.engine.engine import Engine, StepOutput
from andante.engine.stats import EngineLimits


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


@dataclass(slots=True)
class StepMessage:
    """What instance `index` reports after one step (or an idle wake-up)."""

    index: int
    outputs: list[Any] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)
    handoffs: list[Request] = field(default_factory=list)
    load: LoadReport = field(default_factory=LoadReport)
    stepped: bool = False


Post = Callable[[StepMessage], None]
OnChange = Callable[[int, BaseException | None], None]  # (instance index, the cause)


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
    def __init__(self, index: int, engine: Engine, adapter: OutputAdapter | None = None,
                 drop_late: bool = False, model_name: str = "") -> None:
        self.index = index
        self.model_name = model_name
        self.engine = engine
        self.adapter = adapter or NoOutputs()
        self.host = EngineHost(engine, drop_late)
        self._inbox: deque[tuple[str, Any]] = deque()  # appends are thread-safe
        self._wake = threading.Event()
        self._withdrawn: list[Request] = []

    # ---- any thread ---------------------------------------------------------------
    def submit(self, req: Request) -> None:
        self._post("add", req)

    def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        self._post("withdraw", list(request_ids))

    def wake(self) -> None:
        self._wake.set()

    def _post(self, kind: str, item: Any) -> None:
        self._inbox.append((kind, item))
        self._wake.set()

    # ---- the stepping thread ------------------------------------------------------
    def step(self, timeout: float | None = None) -> StepMessage | None:
        """Apply the inbox, then run one engine step; with no work, wait up to `timeout`
        for some. Returns the step's message, or None when nothing happened."""
        self._wake.clear()
        self._apply_inbox()
        if not self.engine.has_work:
            if timeout is not None and timeout > 0:
                self._wake.wait(timeout)
            self._apply_inbox()
        if self.engine.has_work:
            out = self.engine.step()
            self.engine.finish_stopped(out, self.adapter.stopped(out))
            return self._message(out, stepped=True)
        if self._withdrawn:
            return self._message(None, stepped=False)
        return None

    def _apply_inbox(self) -> None:
        inbox = self._inbox
        while inbox:
            kind, item = inbox.popleft()
            if kind == "add":
                self.adapter.register(item)
                self.host.add(item)  # a refused one comes with the next step's output
            elif kind == "abort":
                self.engine.abort(item)
            else:
                self._withdrawn.extend(self.host.withdraw(item))

    def _message(self, out: StepOutput | None, stepped: bool) -> StepMessage:
        finished = [] if out is None else out.finished
        handoffs, self._withdrawn = self._withdrawn, []
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

    def describe(self) -> tuple[EngineLimits, str]:
        """What the engine could ever serve, and the model's name."""
        return self.engine.limits(), self.model_name

