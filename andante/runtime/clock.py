"""A clock several processes (and hosts) can share: wall time since an agreed origin.

In-process instances share one `MonotonicClock` object. Ray actors live in other
processes, possibly on other hosts, where a monotonic clock means nothing to the driver;
they run on `WallClock(origin)` with the driver's origin, so arrival times stamped by
the server and token times recorded by the actors are on one time line (hosts should be
NTP-synchronized, as usual for a cluster).
"""

from __future__ import annotations

from andante.core.clock import WallClock as WallClock  # re-exported: its home is core
