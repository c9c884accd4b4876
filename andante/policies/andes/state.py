"""Per-request QoE state kept incrementally, one numpy slot per live request.

Design note (Andes §3.1 and §3.2, the "Request Tracker"). With start = arrival + TTFT
target and inv = 1 / tds, token k (1-based) is ideally read at start + (k-1)·inv and
actually at C_k = max(arrival_k, C_{k-1} + inv). Its lateness ℓ_k = C_k - ideal_k is
a running maximum, ℓ_k = max(ℓ_{k-1}, arrival_k - (k-1)·inv - start), so three
numbers summarize a whole timeline for every QoE prediction (see `gain.py`):
n (tokens delivered), late = ℓ_n and pos = Σ_k max(ℓ_k, 0). Each new token updates
them in O(1); the scheduler never re-reads timelines. The reader's buffer (what the
token pacer holds) runs dry at C_n = start + (n-1)·inv + ℓ_n.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from andante.core.request import Request
from andante.core.sampling import DEFAULT_TDS, DEFAULT_TTFT_TARGET

#: Lateness of "no token yet": far below any real lateness, finite for the arithmetic.
NO_LATENESS = -1e9
_FIELDS = ("start", "inv", "n", "late", "pos", "last", "prompt")


class RequestTable:
    """Struct-of-arrays state of live requests; `slot(req)` indexes the arrays."""

    def __init__(self, capacity: int = 1024) -> None:
        self._slots: dict[Request, int] = {}
        self._free: list[int] = []
        self._size = 0
        self._init_arrays(max(1, capacity))

    def _init_arrays(self, capacity: int) -> None:
        self.start = np.zeros(capacity)  # arrival + TTFT target (s)
        self.inv = np.ones(capacity)  # 1 / reading speed (s per token)
        self.n = np.zeros(capacity)  # tokens delivered
        self.late = np.full(capacity, NO_LATENESS)  # lateness of the last token (s)
        self.pos = np.zeros(capacity)  # sum of positive lateness (s)
        self.last = np.zeros(capacity)  # time of the last token (arrival if none)
        self.prompt = np.zeros(capacity)  # prompt tokens

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, req: Request) -> bool:
        return req in self._slots

    def _grow(self) -> None:
        capacity = 2 * len(self.start)
        for name in _FIELDS:
            old = getattr(self, name)
            new = np.zeros(capacity) if name != "late" else np.full(capacity, NO_LATENESS)
            new[: len(old)] = old
            setattr(self, name, new)

    def add(self, req: Request) -> int:
        """Track `req` (idempotent); replays tokens it already has."""
        slot = self._slots.get(req)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
        else:
            if self._size == len(self.start):
                self._grow()
            slot = self._size
            self._size += 1
        slo = req.slo
        ttft = slo.ttft if slo.ttft is not None else DEFAULT_TTFT_TARGET
        tds = slo.tds if slo.tds is not None else DEFAULT_TDS
        self.start[slot] = req.arrival_time + ttft
        self.inv[slot] = 1.0 / tds
        self.n[slot] = 0.0
        self.late[slot] = NO_LATENESS
        self.pos[slot] = 0.0
        self.last[slot] = req.arrival_time
        self.prompt[slot] = req.num_prompt_tokens
        self._slots[req] = slot
        for t in req.timeline.token_times:
            self.record(np.array([slot]), t)
        return slot

    def remove(self, req: Request) -> None:
        slot = self._slots.pop(req, None)
        if slot is not None:
            self._free.append(slot)

    def get(self, req: Request) -> int | None:
        return self._slots.get(req)

    def indices(self, reqs: Sequence[Request]) -> np.ndarray:
        """Slots of `reqs` (tracking any request not seen yet)."""
        try:
            return np.fromiter(map(self._slots.__getitem__, reqs), dtype=np.intp,
                               count=len(reqs))
        except KeyError:
            return np.fromiter(map(self.add, reqs), dtype=np.intp, count=len(reqs))

    def slots_of(self, reqs: Iterable[Request]) -> list[int]:
        """Slots of the tracked requests among `reqs` (others skipped)."""
        get = self._slots.get
        return [s for s in map(get, reqs) if s is not None]

    def record(self, idx: np.ndarray, now: float) -> None:
        """One new token at `now` for each slot of `idx` (distinct slots)."""
        n = self.n[idx]
        late = np.maximum(self.late[idx], now - n * self.inv[idx] - self.start[idx])
        self.late[idx] = late
        self.pos[idx] += np.maximum(late, 0.0)
        self.n[idx] = n + 1.0
        self.last[idx] = now

    def buffered(self, idx: np.ndarray, now: float) -> np.ndarray:
        """Seconds of text the reader still has in its pacer buffer at `now` (>= 0)."""
        n = self.n[idx]
        dry = self.start[idx] + (n - 1.0) * self.inv[idx] + self.late[idx]
        return np.where(n > 0, np.maximum(dry - now, 0.0), 0.0)
