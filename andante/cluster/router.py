"""Routers: which instance gets a request.

A router sees the controller's `InstanceSlot`s: each instance's role, whether it is
alive, its latest load report (computed on demand in the simulator, so a router that
never reads `load` costs nothing) and how many requests sent to it it has not taken in
yet (`num_in_transit`). It returns an instance index, or None to keep the request in the
controller's global queue until the next step report.

Design note (least-loaded, power-of-two): the load of an instance is its own predicted
drain time (andante.cluster.load), plus, for requests still in transit to it, the mean
time per request it holds; power-of-two compares two instances drawn at random
(Mitzenmacher's "power of two choices"), which avoids the herd effect of stale reports.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from andante.cluster.load import LoadReport
from andante.core.request import PreemptionMode, Request

__all__ = [
    "InstanceView",
    "LeastLoadedRouter",
    "LoadReport",
    "PowerOfTwoRouter",
    "QueueDecision",
    "QueueRouter",
    "RoundRobinRouter",
    "Router",
    "expected_wait",
]


class InstanceView(Protocol):
    """What a router knows of one instance (the controller's slot)."""

    index: int
    role: str

    @property
    def alive(self) -> bool: ...

    @property
    def load(self) -> LoadReport: ...

    @property
    def num_in_transit(self) -> int: ...


class Router(Protocol):
    """Contract: `route` places a new request, `place_handoff` one that instance
    `source` handed back (an offload or a withdrawal without a set target). Both return
    the index of an alive instance, or None to keep the request in the global queue.
    Routers run in the controller's thread and never read a clock."""

    name: str

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None: ...

    def place_handoff(
        self, req: Request, source: int, instances: Sequence[InstanceView]
    ) -> int | None: ...


@dataclass(frozen=True, slots=True)
class QueueDecision:
    """What a queue-holding router asks for now: requests to place (id, instance),
    model swaps (instance, model), warm starts (instance, model) and evictions of
    running requests (instance, id, mode: recompute or state swap; QLM LSOs 2-3),
    applied before the placements."""

    placements: tuple[tuple[str, int], ...] = ()
    swaps: tuple[tuple[int, str], ...] = ()
    warm: tuple[tuple[int, str], ...] = ()
    evictions: tuple[tuple[int, str, PreemptionMode], ...] = ()


@runtime_checkable
class QueueRouter(Protocol):
    """A router that orders the global queue itself (QLM's virtual queues). Its `route`
    and `place_handoff` keep requests in the controller's queue (None); the controller
    asks `dispatch` with the whole queue after every event that may change a decision
    and applies the answer; `on_finished` reports each request it placed that ended."""

    def dispatch(self, queue: Sequence[Request], instances: Sequence[InstanceView]
                 ) -> QueueDecision: ...

    def on_finished(self, req: Request) -> None: ...


def expected_wait(view: InstanceView) -> float:
    """Predicted drain time plus the mean time per request for those in transit."""
    load = view.load
    pending = view.num_in_transit
    if pending <= 0:
        return load.drain_time
    num_requests = load.stats.num_requests
    per_request = load.drain_time / num_requests if num_requests else 0.0
    return load.drain_time + pending * per_request


def _load_key(view: InstanceView) -> tuple[float, int, int]:
    num_requests = view.load.stats.num_requests
    return (expected_wait(view), num_requests + view.num_in_transit, view.index)


class _RouterBase:
    name = "base"

    def __init__(self, **options: Any) -> None:
        if options:
            raise ValueError(f"router {self.name!r}: unknown option(s) {sorted(options)}")

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        raise NotImplementedError

    def place_handoff(
        self, req: Request, source: int, instances: Sequence[InstanceView]
    ) -> int | None:
        """By default: the least-loaded other alive instance (the source if alone)."""
        others = [v for v in instances if v.alive and v.index != source]
        if not others:
            return source if instances[source].alive else None
        return min(others, key=_load_key).index


class RoundRobinRouter(_RouterBase):
    """Alive instances in turn."""

    name = "round-robin"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._next = 0

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        n = len(instances)
        for offset in range(n):
            index = (self._next + offset) % n
            if instances[index].alive:
                self._next = index + 1
                return index
        return None


class LeastLoadedRouter(_RouterBase):
    """The alive instance with the smallest expected wait (ties: fewer requests)."""

    name = "least-loaded"

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        alive = [v for v in instances if v.alive]
        return min(alive, key=_load_key).index if alive else None


class PowerOfTwoRouter(_RouterBase):
    """The less loaded of two alive instances drawn at random (seeded)."""

    name = "power-of-two"

    def __init__(self, seed: int = 0, **options: Any) -> None:
        super().__init__(**options)
        self._rng = random.Random(seed)

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        alive = [v for v in instances if v.alive]
        if len(alive) <= 2:
            return min(alive, key=_load_key).index if alive else None
        pair = self._rng.sample(alive, 2)
        return min(pair, key=_load_key).index
