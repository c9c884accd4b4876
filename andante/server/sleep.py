"""Sleep mode: vLLM's dev-mode endpoints on andante's server (`--dev-mode`, or
`ANDANTE_SERVER_DEV_MODE=1` as vLLM reads `VLLM_SERVER_DEV_MODE`), so that a fleet in
front (andante.runtime.upstream) can swap the models of servers sharing one device.

- `POST /sleep?level=1|2`: new requests are refused (503, code `sleeping`), the ones in
  flight are let finish (at most `DRAIN_S`; else 409 and the server stays awake), then
  every engine's executor goes to sleep at its next step boundary: level 1 releases the
  KV cache and holds the weights in host memory, level 2 drops the weights too
  (`andante.exec.base.Sleepable`; the torch executor frees its KV tensors, and at level 2
  its loaded and packed weights). The block manager's prefix cache is reset at the same
  boundary (the KV behind it is gone; if a request still held blocks there, the engines
  that slept wake and the answer is 409). Asleep, the server serves nothing. The pipeline
  executor (KunServe's merged groups) sleeps stage by stage in the same way
  (andante.exec.torch_pipeline_sleep); an executor that cannot release its memory gets
  a 501 naming it.
- `POST /wake_up`: the executors restore what they released (KV tensors re-allocated
  with the same shapes; dropped weights reloaded from the model's checkpoint); the
  server takes requests again.
- `GET /is_sleeping`: `{"is_sleeping": bool}`.
Sleeping twice or waking an awake server is a no-op, as in vLLM. Only in-process
engines (`--backend inprocess`, the toy model's default) can sleep; the flag is refused
at start otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import FastAPI

from andante.exec.base import Sleepable
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker
from andante.server.errors import APIError
from andante.server.state import ServerState

DRAIN_S = 30.0
DRAIN_POLL_S = 0.01


class SleepControl:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._lock = asyncio.Lock()

    @property
    def level(self) -> int | None:
        return self.state.sleep_level

    async def sleep(self, level: int) -> None:
        if level not in (1, 2):
            raise APIError(400, f"level must be 1 or 2, got {level}", "level", "invalid_value")
        unable = self._unsleepable()
        if unable:
            raise APIError(501, f"sleep mode needs executors that can release their memory; "
                           f"{', '.join(unable)} cannot",
                           None, "not_implemented")
        async with self._lock:
            if self.state.sleep_level is not None:
                return
            self.state.sleep_level = level  # refuses new requests from now on
            if not await self._drained():
                self.state.sleep_level = None
                raise APIError(409, f"requests still in flight after {DRAIN_S:g} s; the "
                               "server stays awake", None, "busy")
            try:
                await self._on_engines(partial(_sleep_engine, level=level))
            except RuntimeError as exc:  # e.g. a request still holds KV blocks
                await self._on_engines(_wake_engine)  # those that slept; no-op elsewhere
                self.state.sleep_level = None
                raise APIError(409, f"sleep failed ({exc}); the server stays awake", None,
                               "busy") from exc

    async def wake_up(self) -> None:
        async with self._lock:
            if self.state.sleep_level is None:
                return
            await self._on_engines(_wake_engine)
            self.state.sleep_level = None

    def _unsleepable(self) -> list[str]:
        """The executor kinds that would answer "asleep" while holding their memory."""
        kinds = {type(inst.worker.engine.executor).__name__
                 for inst in self.state.runner.instances
                 if isinstance(inst, LocalInstance)
                 and not isinstance(inst.worker.engine.executor, Sleepable)}
        return sorted(kinds)

    async def _drained(self) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_S
        while self.state.hub.num_in_flight:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(DRAIN_POLL_S)
        return True

    async def _on_engines(self, operation: Callable[[InstanceWorker], None]) -> None:
        """`operation` on every engine's worker, on its stepping thread, between steps;
        returns when all have run it."""
        futures = []
        for inst in self.state.runner.instances:
            assert isinstance(inst, LocalInstance)
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            inst.worker.at_boundary(_run_on(operation, done))
            futures.append(asyncio.wrap_future(done))
        await asyncio.gather(*futures)


def _sleep_engine(worker: InstanceWorker, level: int) -> None:
    worker.engine.scheduler.kv.reset_prefix_cache()  # no stale hit survives the sleep
    executor = worker.engine.executor
    if isinstance(executor, Sleepable):
        executor.sleep(level)


def _wake_engine(worker: InstanceWorker) -> None:
    executor = worker.engine.executor
    if isinstance(executor, Sleepable):
        executor.wake_up()


def _run_on(operation: Callable[[InstanceWorker], None],
            done: concurrent.futures.Future[None]) -> Callable[[InstanceWorker], None]:
    def run(worker: InstanceWorker) -> None:
        try:
            operation(worker)
            done.set_result(None)
        except BaseException as exc:  # reported to the caller, not to the engine
            done.set_exception(exc)

    return run


def install_sleep_routes(app: FastAPI, state: ServerState) -> None:
    control = SleepControl(state)

    @app.post("/sleep")
    async def sleep(level: int = 1) -> dict[str, Any]:
        await control.sleep(level)
        return {"is_sleeping": True, "level": control.level}

    @app.post("/wake_up")
    async def wake_up() -> dict[str, Any]:
        await control.wake_up()
        return {"is_sleeping": False}

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, Any]:
        return {"is_sleeping": control.level is not None}
