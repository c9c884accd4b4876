"""A minimal progress bar on stderr for long runs (no dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts finished items; redraws at most every `interval` s, only on a terminal
    unless forced."""

    def __init__(
        self, total: int, label: str, enabled: bool | None = None, stream: TextIO | None = None
    ) -> None:
        self.total = max(1, total)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.count = 0
        self.started = time.perf_counter()
        self._last_draw = 0.0

    def advance(self, n: int = 1) -> None:
        self.count += n
        now = time.perf_counter()
        if self.enabled and (now - self._last_draw > 0.25 or self.count >= self.total):
            self._last_draw = now
            self._draw(now)

    def on_item(self, _item: object) -> None:
        """Callback form of `advance()`."""
        self.advance()

    def _draw(self, now: float) -> None:
        share = min(1.0, self.count / self.total)
        bar = "#" * int(30 * share)
        elapsed = now - self.started
        self.stream.write(
            f"\r{self.label}: [{bar:<30}] {self.count}/{self.total} ({elapsed:.1f} s)"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()
