"""The client-side token pacer (Andes §5, Fig. 10).

Design note: the server pushes tokens as soon as they are generated; the pacer buffers
them and releases token i at T_i = max(arrival_i, T_{i-1} + 1/tds), the reader's
consumption timeline of DESIGN.md §5, so a burst of tokens is spread out at the reading
speed and a server-side pause is absorbed by the buffer. The release times it records
are what the reader actually experienced; `experienced_qoe` scores them with Andes'
QoE (andante.metrics.qoe).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from andante.metrics import qoe


@dataclass(frozen=True, slots=True)
class PacedToken:
    text: str
    arrival: float  # when it reached the client
    release: float  # when the pacer handed it to the reader


class _End:
    pass


_END = _End()


class TokenPacer:
    """Buffer pushed tokens; iterate to receive them at `tds` tokens per second.

    `push` and `close` may be called from the same event loop while a consumer iterates.
    Times come from `clock` (default `time.perf_counter`).
    """

    def __init__(
        self,
        tds: float,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not (math.isfinite(tds) and tds > 0):
            raise ValueError(f"tds must be a positive finite number, got {tds!r}")
        self.tds = tds
        self._clock = clock
        self._sleep = sleep
        self._queue: asyncio.Queue[tuple[str, float] | _End] = asyncio.Queue()
        self.released: list[PacedToken] = []

    def push(self, text: str, arrival: float | None = None) -> None:
        self._queue.put_nowait((text, self._clock() if arrival is None else arrival))

    def close(self) -> None:
        self._queue.put_nowait(_END)

    async def __aiter__(self) -> AsyncIterator[PacedToken]:
        interval = 1.0 / self.tds
        while True:
            item = await self._queue.get()
            if isinstance(item, _End):
                return
            text, arrival = item
            due = arrival
            if self.released:
                due = max(arrival, self.released[-1].release + interval)
            wait = due - self._clock()
            if wait > 0:
                await self._sleep(wait)
            token = PacedToken(text, arrival, self._clock())
            self.released.append(token)
            yield token

    def experienced_qoe(self, send_time: float, ttft_target: float) -> float:
        """Andes QoE of the release timeline, from the request's send time."""
        times = [t.release for t in self.released]
        return qoe(send_time, times, ttft_target, self.tds) if times else 0.0
