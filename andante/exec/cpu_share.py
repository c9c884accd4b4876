"""How much of the machine other processes used over an interval, from /proc/stat.

Design note. The 1-minute load average lags by about a minute and counts our own
threads, so it cannot tell whether a start-up measurement ran beside a neighbour that
began a few seconds earlier (issue 32: a busy machine's thread choice was cached and
reused on a quiet one). Instead, read the kernel's CPU accounting before and after the
measurement: /proc/stat's first line gives every CPU's busy and idle time, and the
process's own CPU time (`time.process_time`, all its threads) is subtracted from the
busy time, leaving what the rest of the machine used. Divided by the interval's whole
capacity (wall time x cores, i.e. busy + idle), it is the others' CPU share: 0 on an
idle machine, 0.5 with one of two cores taken by a neighbour. Only the CPUs this process
may run on count (its affinity mask, os.sched_getaffinity: a taskset or a cpuset
container): a neighbour on our 2 cores of a 64-core host is half of our capacity, not
3% of the host's. Where every CPU is allowed, the aggregate "cpu" line is read as is.
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


def parse_proc_stat(text: str, ticks_per_second: float,
                    cpus: frozenset[int] | None = None) -> tuple[float, float]:
    """(busy, total) seconds of the CPUs `cpus` (None: all) from /proc/stat: busy is
    user + nice + system + irq + softirq + steal; idle + iowait complete the total
    (guest time is already inside user). All CPUs, or a set holding every cpuN line,
    read the aggregate "cpu" line; a subset sums its cpuN lines."""
    lines = {fields[0]: fields for fields in map(str.split, text.splitlines()) if fields}
    per_cpu = {int(name[3:]) for name in lines if name[3:].isdigit() and name[:3] == "cpu"}
    names = ["cpu"] if cpus is None or per_cpu <= cpus else [
        f"cpu{n}" for n in sorted(cpus) if f"cpu{n}" in lines]
    if not names or names[0] not in lines:
        raise ValueError("no aggregate 'cpu' line (or no allowed cpuN line) in /proc/stat")
    busy = total = 0.0
    for name in names:
        ticks = [float(v) for v in lines[name][1:9]] + [0.0] * (8 - len(lines[name][1:9]))
        user, nice, system, idle, iowait, irq, softirq, steal = ticks
        used = user + nice + system + irq + softirq + steal
        busy, total = busy + used, total + used + idle + iowait
    return busy / ticks_per_second, total / ticks_per_second


def allowed_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (None where the platform cannot say)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return None if getaffinity is None else frozenset(getaffinity(0))


def read_cpu_times(read_text: Callable[[], str] | None = None,
                   cpus: Callable[[], frozenset[int] | None] = allowed_cpus,
                   ) -> CpuTimes | None:
    """Now's CPU times over the CPUs `cpus()` allows, or None where /proc/stat (or
    `read_text()`, standing in for it) is missing or unreadable."""
    try:
        text = read_text() if read_text is not None else _read_proc_stat()
        busy, total = parse_proc_stat(text, float(os.sysconf("SC_CLK_TCK")), cpus())
    except (OSError, ValueError):
        return None
    return CpuTimes(busy, total, time.process_time())


def _read_proc_stat() -> str:
    with open(PROC_STAT, encoding="ascii") as fh:
        return fh.read()


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
