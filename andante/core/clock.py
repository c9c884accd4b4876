"""Time as an injected dependency (DESIGN.md rule 1).

The scheduler, block manager, policies and cluster policies never read the wall clock:
they call `Clock.now()`. The server passes `MonotonicClock`; the simulator passes its
event loop's clock; processes that share a time line (Ray actors, vLLM's engine core)
use `WallClock`, wall time since an agreed origin (andante.runtime.clock says why).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of time in seconds; must be non-decreasing."""

    def now(self) -> float: ...


class MonotonicClock:
    """Wall time for real serving: seconds since this clock was made."""

    def __init__(self) -> None:
        self._origin = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._origin


class WallClock:
    """Seconds since `origin` (a `time.time()` value); never goes back within a process."""

    def __init__(self, origin: float | None = None) -> None:
        self.origin = time.time() if origin is None else origin
        self._last = 0.0

    def now(self) -> float:
        self._last = max(self._last, time.time() - self.origin)
        return self._last


class ManualClock:
    """A clock that only moves when told to (the simulator and tests use it)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"clock cannot go back from {self._now} to {t}")
        self._now = t
