"""A clock several processes (and hosts) can share: wall time since an agreed origin.

In-process instances share one `MonotonicClock` object. Ray actors live in other
processes, possibly on other hosts, where a monotonic clock means nothing to the driver;
they run on `WallClock(origin)` with the driver's origin, so arrival times stamped by
the server and token times recorded by the actors are on one time line (hosts should be
NTP-synchronized, as usual for a cluster).
"""

from __future__ import annotations

import time


class WallClock:
    """Seconds since `origin` (a `time.time()` value); never goes back within a process."""

    def __init__(self, origin: float | None = None) -> None:
        self.origin = time.time() if origin is None else origin
        self._last = 0.0

    def now(self) -> float:
        self._last = max(self._last, time.time() - self.origin)
        return self._last
