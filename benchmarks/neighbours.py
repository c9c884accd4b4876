"""CPU-bound neighbour processes started at given moments of a measured run (issue 32:
"neighbours arriving mid-run"), stopped by their PIDs when the run ends.

`Neighbours([0.0, 20.0]).around(work)` runs `work()` with one busy-looping Python
process started as it begins and another 20 s later; it returns work's result and the
seconds (from the run's start) at which each neighbour actually started.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

SPIN = "while True: pass"


class Neighbours:
    def __init__(self, start_after_s: Sequence[float]) -> None:
        if any(s < 0 for s in start_after_s):
            raise ValueError(f"neighbour start times must be >= 0, got {list(start_after_s)}")
        self.start_after_s = sorted(start_after_s)

    def around(self, work: Callable[[], T]) -> tuple[T, list[float]]:
        procs: list[subprocess.Popen[bytes]] = []
        started: list[float] = []
        lock = threading.Lock()
        stopped = threading.Event()
        t0 = time.perf_counter()

        def start() -> None:
            with lock:
                if stopped.is_set():
                    return
                procs.append(subprocess.Popen([sys.executable, "-c", SPIN]))
                started.append(round(time.perf_counter() - t0, 2))

        timers = [threading.Timer(s, start) for s in self.start_after_s]
        for timer in timers:
            timer.start()
        try:
            result = work()
        finally:
            with lock:
                stopped.set()
            for timer in timers:
                timer.cancel()
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=10)
        return result, started
