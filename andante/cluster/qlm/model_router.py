"""Routing by model over multi-model instances (default routers; `qlm` orders its own
queue): how the server places requests when it serves several models.

Design note (QLM §3, LSO 5 on the serving side): a request goes to the instances that
hold its model on the device, where the configured router (round-robin, least-loaded...)
picks one. When none does, the request is not refused: it goes to the instance already
swapping to its model, else to the least-loaded instance that can swap (QLM's load
balancing) without a swap pending; that instance parks it and swaps at its next step
boundary once its engine is dry (andante.cluster.qlm.swap). A swap that instance has
not reported taking in yet counts as pending, so two requests never start two swaps on
one instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from andante.cluster.load import LoadReport
from andante.cluster.router import InstanceView, Router, expected_wait
from andante.core.request import Request


class ModelHolder(Protocol):
    """An instance that says which model is on its device and which it will swap to."""

    def device_model(self) -> str: ...

    def next_model(self) -> str | None: ...


class _Renumbered:
    """A view of an instance under another index (its position in a subset)."""

    def __init__(self, view: InstanceView, index: int) -> None:
        self._view = view
        self.index = index
        self.role = view.role

    @property
    def alive(self) -> bool:
        return self._view.alive

    @property
    def load(self) -> LoadReport:
        return self._view.load

    @property
    def num_in_transit(self) -> int:
        return self._view.num_in_transit


class ModelRouter:
    """The configured router, restricted to the instances serving the request's model."""

    def __init__(self, inner: Router, holders: Sequence[ModelHolder]) -> None:
        self.inner = inner
        self.name = inner.name
        self._holders = list(holders)
        self._sent: dict[int, str] = {}  # instance -> the model a request asked it to load

    def __getattr__(self, name: str) -> Any:  # the inner router's counters
        return getattr(self.inner, name)

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        alive = [v for v in instances if v.alive]
        if not req.model:
            return self._inner_route(req, alive)
        serving = [v for v in alive if self._coming(v) is None
                   and self._holders[v.index].device_model() == req.model]
        if serving:
            return self._inner_route(req, serving)
        return self._swap_target(req.model, alive)

    def _inner_route(self, req: Request, views: Sequence[InstanceView]) -> int | None:
        """The inner router over a subset, seen as instances 0..k-1 (a router may
        answer with a position in the list it was given)."""
        picked = self.inner.route(req, [_Renumbered(v, i) for i, v in enumerate(views)])
        return None if picked is None else views[picked].index

    def place_handoff(self, req: Request, source: int,
                      instances: Sequence[InstanceView]) -> int | None:
        return self.route(req, instances)

    def _coming(self, view: InstanceView) -> str | None:
        """The model the instance is about to swap to (None: no swap pending): its own
        word once it has taken in what was sent to it, else what was sent."""
        sent = self._sent.get(view.index)
        if sent is not None and view.num_in_transit <= 0:
            del self._sent[view.index]
            sent = None
        return self._holders[view.index].next_model() or sent

    def _swap_target(self, model: str, alive: Sequence[InstanceView]) -> int | None:
        joining = [v for v in alive if self._coming(v) == model]
        if joining:
            return min(joining, key=expected_wait).index
        free = [v for v in alive if self._coming(v) is None]
        if not free:
            return None  # every instance is swapping: wait in the global queue
        target = min(free, key=lambda v: (expected_wait(v), v.index)).index
        self._sent[target] = model
        return target
