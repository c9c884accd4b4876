"""Everything one server instance owns (no module-level state: one per app)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from andante.core.request import Request
from andante.server.admission import Admission
from andante.server.config import HTTPLimits, ServeOptions
from andante.server.errors import APIError
from andante.server.live import LiveStats
from andante.server.metrics import ServerMetrics, router_counters
from andante.server.runner import ClusterRunner
from andante.server.streams import RequestStream, StreamHub

if TYPE_CHECKING:  # an annotation only: the fleet front imports this module engine-free
    from andante.server.backend import Backend

log = logging.getLogger("andante.server")
T = TypeVar("T")
EXIT_GRACE_S = 1.0  # for the failed streams' error events to reach their clients


@dataclass(slots=True)
class ServerState:
    options: ServeOptions
    backend: Backend
    runner: ClusterRunner
    hub: StreamHub
    metrics: ServerMetrics
    live: LiveStats
    admission: Admission
    # parsing and tokenising (chat templates too) run here, off the event loop: one
    # thread, as the tokenizer is not safe to share between several
    prep_pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        1, thread_name_prefix="andante-prepare"))
    on_fatal: Callable[[], None] | None = None  # every engine is down (launch: exit)
    sleep_level: int | None = None  # asleep (andante.server.sleep): refuses requests

    @classmethod
    def create(cls, options: ServeOptions, backend: Backend) -> ServerState:
        runner = backend.runner
        hub = StreamHub()
        metrics = ServerMetrics(backend.model_name, lambda: runner.stats,
                                router_counters(runner.controller.router))
        live = LiveStats(backend.clock, lambda: runner.stats)
        hub.add_observer(metrics.observe)
        hub.add_observer(live.observe)
        runner.add_swap_observer(metrics.observe_swaps)
        return cls(options, backend, runner, hub, metrics, live, Admission(backend))

    @property
    def limits(self) -> HTTPLimits:
        return self.options.limits

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        def on_failure(exc: BaseException) -> None:
            log.critical("every engine instance is down (%s): open requests fail, and the "
                         "server exits", exc)
            self.hub.fail_all()
            if self.on_fatal is not None:
                loop.call_later(EXIT_GRACE_S, self.on_fatal)

        self.runner.start(loop, self.hub.deliver, on_failure)

    def stop(self) -> None:
        self.runner.stop()
        self.prep_pool.shutdown(wait=False, cancel_futures=True)

    async def prepare(self, fn: Callable[[bytes], T], raw: bytes) -> T:
        """`fn(raw)` (parse and tokenise a request body) on the preparation thread."""
        return await asyncio.get_running_loop().run_in_executor(self.prep_pool, fn, raw)

    def check_accepting(self) -> None:
        """503 if the engine is down; 429 with Retry-After if the queue is full."""
        if not self.runner.is_alive:
            raise APIError(503, "the engine is not running", None, "engine_unavailable")
        if self.sleep_level is not None:
            raise APIError(503, f"the server is asleep (level {self.sleep_level}): POST "
                           "/wake_up first", None, "sleeping")
        queued = self.hub.num_not_started
        if queued >= self.options.max_queued:
            retry = self._retry_after(queued)
            raise APIError(
                429, f"too many requests waiting ({queued} queued, limit "
                f"{self.options.max_queued}); retry in {retry} s", None, "queue_full",
                headers={"Retry-After": str(retry)},
            )

    def _retry_after(self, queued: int) -> int:
        """Seconds until the queue has probably drained enough (1 to 60)."""
        rate = self.live.recent_finish_rate()
        if rate <= 0:
            return 1
        return max(1, min(60, math.ceil(queued / rate)))

    def submit(self, req: Request) -> RequestStream:
        stream = self.hub.open(req.request_id, req.num_prompt_tokens)
        self.runner.submit(req)
        return stream

    def abort(self, request_id: str) -> None:
        self.hub.close(request_id)
        self.runner.abort(request_id)
