"""QLM's model swap on one instance: park, flush, load, release (LSO 5).

Design note (QLM §5, LSO 5 "model swapping"; DESIGN.md §4 "One instance, two clocks").
An instance serves one model at a time (its engine's executor holds the device copy). A
request for another model is *parked* (in arrival order; a request behind a parked one
waits too, so the order holds). A swap happens at a step boundary of the instance: when
asked for (`ask`: a router that drives swaps, QLM's agents), or, without one, when
requests are parked and the engine has run dry (the oldest parked request's model, one
run of a model at a time). The swap:
1. flushes the engine: its unfinished requests lose their KV (preempted by recompute;
   their output so far is kept) and go back to the controller, which places them again
   wherever their model is served;
2. has the instance install the incoming model (`SwapSite.install`: the simulator builds an
   engine over a `SimExecutor` and models the load from the tier's bandwidth; the
   runtime's worker builds one from the weights and measures it);
3. moves the models between the tiers (andante.cluster.qlm.tiers: the outgoing model
   stays warm while host memory allows);
4. records the swap and releases the parked requests of the new model, in order, up to
   the first request of another model.

`ModelSwitcher` is pure: no threads, no clock (the caller passes `now`). The
simulator's `SimInstance` and the runtime's `InstanceWorker` drive it on their clocks and
implement `SwapSite`; neither keeps its own copy of these steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from andante.cluster.qlm.tiers import ModelSwap, ModelTiers
from andante.core.request import Request, RequestStatus
from andante.engine.engine import Engine


class SwapSite(Protocol):
    """The instance a `ModelSwitcher` swaps (contract).

    `engine`: the engine serving now. `install(model, source)`: replace the engine by one
    serving `model`, loaded from tier `source` (HOST: warm, DISK: cold); returns the
    seconds the load takes (modelled or measured); called before the tiers move, so the
    tiers still say where `model` is. `admit(req)`: hand a released parked request to the
    (new) engine. `hand_back(reqs)`: give the flushed requests back to the controller."""

    @property
    def engine(self) -> Engine: ...

    def install(self, model: str, source: str) -> float: ...

    def admit(self, req: Request) -> None: ...

    def hand_back(self, reqs: list[Request]) -> None: ...


def flush(engine: Engine, now: float) -> list[Request]:
    """The engine's unfinished requests, their KV dropped (recomputed later; the engine
    goes with the swap, so its blocks need no freeing)."""
    evicted = list(engine.scheduler.requests.values())
    for req in evicted:
        if req.status in (RequestStatus.RUNNING, RequestStatus.SWAPPED):
            req.preempt_by_recompute(now)
    return evicted


class ModelSwitcher:
    """The parked requests, the swap asked for and the swaps done of one multi-model
    instance (see the module note)."""

    def __init__(self, tiers: ModelTiers, site: SwapSite) -> None:
        self.tiers = tiers
        self.site = site
        self.parked: deque[Request] = deque()  # requests waiting for their model, FCFS
        self.pending: str | None = None  # the swap asked for, done at the next boundary
        self.swaps: list[ModelSwap] = []

    # ---- parking ------------------------------------------------------------------
    def serves_now(self, req: Request) -> bool:
        return not req.model or req.model == self.tiers.device

    def must_park(self, req: Request) -> bool:
        """Does `req` wait here for a swap (its model is not on the device, or others
        wait before it)?"""
        return bool(self.parked) or not self.serves_now(req)

    def park(self, req: Request) -> None:
        self.parked.append(req)

    def unpark(self, request_ids: Sequence[str]) -> list[Request]:
        """Take these requests out of the parked ones (those found, in order)."""
        ids = set(request_ids)
        found = [r for r in self.parked if r.request_id in ids]
        if found:
            self.parked = deque(r for r in self.parked if r.request_id not in ids)
        return found

    def release_parked(self) -> None:
        """Parked requests for the device model, in order, up to the first of another."""
        while self.parked and self.serves_now(self.parked[0]):
            self.site.admit(self.parked.popleft())

    # ---- swaps --------------------------------------------------------------------
    def ask(self, model: str) -> None:
        """Serve `model` from the next step boundary (ValueError: not one of ours)."""
        self.tiers.check(model)
        self.pending = model

    @property
    def due(self) -> bool:
        """An asked-for swap, or parked requests and a dry engine."""
        return self.pending is not None or (bool(self.parked)
                                            and not self.site.engine.has_work)

    @property
    def next_model(self) -> str | None:
        """The model this instance will swap to (asked for, or its parked head's); safe
        to read from another thread."""
        if self.pending is not None:
            return self.pending
        try:
            head = self.parked[0].model
        except IndexError:
            return None
        return head if head and head != self.tiers.device else None

    def at_boundary(self, now: float) -> ModelSwap | None:
        """At a step boundary: the swap that is due, if any (`due`)."""
        if not self.due:
            return None
        model = self.pending or self.parked[0].model
        self.pending = None
        return self.swap(model, now)

    def swap(self, model: str, now: float) -> ModelSwap | None:
        """Serve `model` from now (the module note's steps); None when it is on the
        device already (the parked requests for it are released)."""
        if not model or model == self.tiers.device:
            self.release_parked()
            return None
        evicted = flush(self.site.engine, now)
        outgoing, source = self.tiers.device, self.tiers.tier(model)
        seconds = self.site.install(model, source)
        self.tiers.activate(model)
        swap = ModelSwap(now, outgoing, model, source, seconds, len(evicted))
        self.swaps.append(swap)
        if evicted:
            self.site.hand_back(evicted)
        self.release_parked()
        return swap
