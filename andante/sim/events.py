"""A deterministic event heap keyed by (time, priority, seq_no)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class EventKind(IntEnum):
    """Lower value runs first among events at the same time."""

    ARRIVAL = 0  # a request reaches the router
    STEP_DONE = 1  # an instance's step finishes
    KICK = 2  # an idle instance looks for work (after every same-time arrival)


@dataclass(order=True, slots=True)
class Event:
    time: float
    kind: EventKind
    seq_no: int
    payload: Any = field(compare=False, default=None)


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq_no = 0

    def push(self, time: float, kind: EventKind, payload: Any = None) -> None:
        self._seq_no += 1
        heapq.heappush(self._heap, Event(time, kind, self._seq_no, payload))

    def pop(self) -> Event:
        return heapq.heappop(self._heap)

    def next_time(self) -> float:
        """The time of the earliest event (inf if none)."""
        return self._heap[0].time if self._heap else math.inf

    def __bool__(self) -> bool:
        return bool(self._heap)
