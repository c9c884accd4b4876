"""The engine thread: steps the engine off the event loop and hands each step's output
to the loop in one call.

Design note (DESIGN.md §3, issue 4): the web layer never touches the scheduler. It
submits and aborts through the engine's thread-safe inbox and wakes this thread with an
event; when there is no work the thread sleeps on that event (no busy spin). After each
step the thread detokenizes (`OutputProcessor`), publishes an `EngineSnapshot` (one
reference store, read by /metrics and the live page) and, if the step produced
anything, schedules exactly one `loop.call_soon_threadsafe(deliver, deltas)` carrying
every request's output of that step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from andante.core.request import Request
from andante.engine.engine import Engine
from andante.models.interface import IncrementalDecoder
from andante.server.outputs import Delta, OutputProcessor

log = logging.getLogger("andante.server")


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """Engine figures after a step (engine-clock seconds)."""

    time: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_free_device_blocks: int = 0
    num_device_blocks: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0
    num_steps: int = 0


Deliver = Callable[[list[Delta]], None]
OnFailure = Callable[[BaseException], None]


class EngineRunner:
    """Owns the engine's thread. `start(loop, deliver)` once; `stop()` to end it."""

    def __init__(self, engine: Engine, outputs: OutputProcessor) -> None:
        self.engine = engine
        self.outputs = outputs
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.snapshot = self._take_snapshot()

    # ---- any thread ---------------------------------------------------------------
    def submit(self, req: Request, decoder: IncrementalDecoder, stop: tuple[str, ...]) -> None:
        self.outputs.register(req.request_id, decoder, stop)
        self.engine.submit(req)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # ---- lifecycle ----------------------------------------------------------------
    def start(
        self, loop: asyncio.AbstractEventLoop, deliver: Deliver, on_failure: OnFailure
    ) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine thread is already started")
        self._thread = threading.Thread(
            target=self._run, args=(loop, deliver, on_failure), name="andante-engine", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- engine thread ------------------------------------------------------------
    def _run(
        self, loop: asyncio.AbstractEventLoop, deliver: Deliver, on_failure: OnFailure
    ) -> None:
        try:
            self._loop(loop, deliver)
        except BaseException as exc:  # the engine is broken: fail every stream, stay down
            log.exception("engine thread failed")
            self.error = exc
            if not loop.is_closed():
                loop.call_soon_threadsafe(on_failure, exc)

    def _loop(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        engine = self.engine
        while not self._stopping.is_set():
            self._wake.clear()
            if not engine.has_work:
                self._wake.wait()
                continue
            out = engine.step()
            engine.finish_stopped(out, self.outputs.stopped(out))
            deltas = self.outputs.deltas(out)
            self.snapshot = self._take_snapshot()
            if deltas and not loop.is_closed():
                loop.call_soon_threadsafe(deliver, deltas)

    def _take_snapshot(self) -> EngineSnapshot:
        sched = self.engine.scheduler
        kv = sched.kv
        return EngineSnapshot(
            time=self.engine.clock.now(),
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            num_swapped=sched.num_swapped,
            num_free_device_blocks=kv.num_free_device_blocks,
            num_device_blocks=kv.num_device_blocks,
            kv_usage=kv.usage,
            num_preemptions=sched.num_preemptions,
            num_steps=self.engine.num_steps,
        )
