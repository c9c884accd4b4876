"""Figures for the live page: the engines' stats and recently finished requests."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from andante.core.clock import Clock
from andante.engine.stats import SchedulerStats
from andante.metrics import qoe_of, ttft
from andante.server.outputs import Delta
from andante.server.runner import stats_dict

RECENT_SECONDS = 60.0
MAX_RECENT = 500


class LiveStats:
    """Keeps (finish time, ttft, qoe, output tokens) of recent requests (loop thread)."""

    def __init__(self, clock: Clock, stats: Callable[[], SchedulerStats]) -> None:
        self._clock = clock
        self._stats = stats
        self._recent: deque[tuple[float, float | None, float, int]] = deque(maxlen=MAX_RECENT)
        self.num_finished = 0

    def observe(self, deltas: list[Delta]) -> None:
        for delta in deltas:
            record = delta.record
            if record is None or record.is_aborted:
                continue
            self.num_finished += 1
            end = record.token_times[-1] if record.token_times else self._clock.now()
            self._recent.append((end, ttft(record), qoe_of(record), record.num_output_tokens))

    def _window(self) -> list[tuple[float, float | None, float, int]]:
        since = self._clock.now() - RECENT_SECONDS
        return [r for r in self._recent if r[0] >= since]

    def recent_finish_rate(self) -> float:
        """Finished requests per second over the last minute."""
        recent = self._window()
        if len(recent) < 2:
            return 0.0
        span = self._clock.now() - recent[0][0]
        return len(recent) / span if span > 0 else 0.0

    def stats(self, num_in_flight: int) -> dict[str, Any]:
        now = self._clock.now()
        recent = self._window()
        qoes = [q for _, _, q, _ in recent]
        return {
            "now": now,
            "engine": stats_dict(self._stats()),
            "num_in_flight": num_in_flight,
            "num_finished": self.num_finished,
            "recent": [
                {"t": t, "ttft": first, "qoe": q, "tokens": n} for t, first, q, n in recent
            ],
            "mean_qoe": sum(qoes) / len(qoes) if qoes else None,
        }
