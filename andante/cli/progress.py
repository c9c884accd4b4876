"""Progress on stderr for long runs (no dependency): a bar redrawn in place on a
terminal, one plain line every few seconds elsewhere (logs, CI); and a heartbeat for
runs whose length is unknown."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

BAR_INTERVAL_S = 0.25
LINE_INTERVAL_S = 10.0


class Progress:
    """Counts finished items. `enabled` None: on, as a bar on a terminal and as lines
    otherwise; False: silent; True: the bar even off a terminal."""

    def __init__(
        self, total: int, label: str, enabled: bool | None = None, stream: TextIO | None = None
    ) -> None:
        self.total = max(1, total)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled is not False
        self.bar = enabled is True or (enabled is None and self.stream.isatty())
        self.interval = BAR_INTERVAL_S if self.bar else LINE_INTERVAL_S
        self.count = 0
        self.started = time.perf_counter()
        self._last_draw = self.started

    def advance(self, n: int = 1) -> None:
        self.count += n
        now = time.perf_counter()
        if self.enabled and (now - self._last_draw > self.interval or self.count >= self.total):
            self._last_draw = now
            self._draw(now)

    def on_item(self, _item: object) -> None:
        """Callback form of `advance()`."""
        self.advance()

    def _draw(self, now: float) -> None:
        elapsed = now - self.started
        if self.bar:
            bar = "#" * int(30 * min(1.0, self.count / self.total))
            self.stream.write(
                f"\r{self.label}: [{bar:<30}] {self.count}/{self.total} ({elapsed:.1f} s)")
        else:
            self.stream.write(f"{self.label}: {self.count}/{self.total} done ({elapsed:.0f} s)\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()


class Heartbeat:
    """A context manager printing `label: still running (N s)` every `interval` s from a
    background thread, for work that reports no progress of its own."""

    def __init__(self, label: str, interval: float = LINE_INTERVAL_S,
                 stream: TextIO | None = None) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.label = label
        self.interval = interval
        self.stream = stream or sys.stderr
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="andante-heartbeat",
                                        daemon=True)
        self.started = time.perf_counter()

    def _beat(self) -> None:
        while not self._done.wait(self.interval):
            elapsed = time.perf_counter() - self.started
            self.stream.write(f"{self.label}: still running ({elapsed:.0f} s)\n")
            self.stream.flush()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()
