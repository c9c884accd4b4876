"""How much of the machine other processes used over an interval, from /proc/stat.

Design note. The 1-minute load average lags by about a minute and counts our own
threads, so it cannot tell whether a start-up measurement ran beside a neighbour that
began a few seconds earlier (issue 32: a busy machine's thread choice was cached and
reused on a quiet one). Instead, read the kernel's CPU accounting before and after the
measurement: /proc/stat's first line gives every CPU's busy and idle time, and the
process's own CPU time (`time.process_time`, all its threads) is subtracted from the
busy time, leaving what the rest of the machine used. Divided by the interval's whole
capacity (wall time x cores, i.e. busy + idle), it is the others' CPU share: 0 on an
idle machine, 0.5 with one of two cores taken by a neighbour.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: A measurement counts as taken on an idle machine when other processes used less than
#: this share of the machine's CPU capacity meanwhile (daemons and shells: ~1-3%).
IDLE_OTHERS_SHARE = 0.1

PROC_STAT = "/proc/stat"


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Seconds since boot: all CPUs busy, all CPUs busy + idle; this process's CPU time."""

    busy: float
    total: float
    own: float


def parse_proc_stat(text: str, ticks_per_second: float) -> tuple[float, float]:
    """(busy, total) seconds of all CPUs from /proc/stat's aggregate "cpu" line: busy is
    user + nice + system + irq + softirq + steal; idle + iowait complete the total
    (guest time is already inside user)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [float(v) for v in fields[1:9]] + [0.0] * (8 - len(fields[1:9]))
            user, nice, system, idle, iowait, irq, softirq, steal = ticks
            busy = user + nice + system + irq + softirq + steal
            return busy / ticks_per_second, (busy + idle + iowait) / ticks_per_second
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


def read_cpu_times() -> CpuTimes | None:
    """Now's CPU times, or None where /proc/stat is missing or unreadable."""
    try:
        with open(PROC_STAT, encoding="ascii") as fh:
            text = fh.read()
        busy, total = parse_proc_stat(text, float(os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError):
        return None
    return CpuTimes(busy, total, time.process_time())


def others_share(before: CpuTimes, after: CpuTimes) -> float:
    """The share of the machine's CPU capacity that other processes used between the two
    readings (clamped to [0, 1]; 0 when no time passed)."""
    total = after.total - before.total
    if total <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return min(1.0, max(0.0, others / total))


def measure_others_share(run: Callable[[], T],
                         reader: Callable[[], CpuTimes | None] = read_cpu_times,
                         ) -> tuple[T, float | None]:
    """`run()`'s result and the others' CPU share while it ran (None: not measurable)."""
    before = reader()
    result = run()
    after = reader()
    if before is None or after is None:
        return result, None
    return result, others_share(before, after)
