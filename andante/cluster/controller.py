"""The controller: a global queue in front of N instances, a router, cluster operations.

Design note (DESIGN.md §4; Ascendra §4 "controller"; QLM §3 global queue): the controller
is a passive, single-threaded state machine. Its inputs are events — a request arrives
(`submit`), a client goes away (`abort`), an instance finished a step (`on_step`: the
requests that finished and those it handed back), an instance died or came back — and
its outputs are calls on `Instance`s. It reads no clock and does no I/O, so the same
class runs in the simulator (over `SimInstance`s, driven by the event loop) and in the
server (over in-process engine threads or Ray actors, driven by the asyncio loop that
receives one message per engine step).

It tracks which instance owns each unfinished request, so that it can migrate a waiting
one, place an offloaded one (Ascendra: LP hands the prompt back, the router picks an HP
instance) and re-queue the unfinished requests of a dead instance: those that have not
streamed a token yet start again elsewhere, the others fail with a clear error (their
client already holds part of an answer that cannot be resumed bit for bit).

A `QueueRouter` (QLM) holds the queue instead: every request waits in the global queue
and the router's `dispatch` decides which to place where, and which instances swap or
warm a model (QLM §5's per-instance agents, here one call per event).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from andante.cluster.instance import EVICT, SWAP_MODEL, Instance, MultiModel, fresh_copy
from andante.cluster.load import LoadReport
from andante.cluster.router import QueueDecision, QueueRouter, Router
from andante.core.request import Request


class InstanceSlot:
    """The controller's record of one instance; routers see these (`InstanceView`)."""

    __slots__ = ("down", "index", "instance", "num_sent", "role")

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.index = instance.index
        self.role = instance.role
        self.num_sent = 0  # requests handed to it since it (re)started
        self.down = False

    @property
    def alive(self) -> bool:
        return not self.down and self.instance.alive

    @property
    def load(self) -> LoadReport:
        return self.instance.load()

    @property
    def multi_model(self) -> MultiModel | None:
        return self.instance if isinstance(self.instance, MultiModel) else None

    @property
    def num_in_transit(self) -> int:
        return max(0, self.num_sent - self.instance.load().num_received)


@dataclass(slots=True)
class FailureOutcome:
    """What happened to a dead instance's requests: re-queued ids, failed ids."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class ClusterOperator(Protocol):
    """Runs after each instance step (`Controller.after_step`), e.g. KunServe's
    coordinator: it reads the slots' loads and calls cluster operations."""

    def after_step(self, controller: Controller) -> None: ...


class Controller:
    def __init__(self, instances: Sequence[Instance], router: Router,
                 operators: Sequence[ClusterOperator] = ()) -> None:
        if not instances:
            raise ValueError("a controller needs at least one instance")
        indices = [inst.index for inst in instances]
        if indices != list(range(len(instances))):
            raise ValueError(f"instance indices must be 0..{len(instances) - 1}, got {indices}")
        self.slots = [InstanceSlot(inst) for inst in instances]
        self.router = router
        self.queue: deque[Request] = deque()  # global queue: not placed on any instance
        self._owned: dict[str, tuple[int, Request]] = {}
        self._moves: dict[str, int] = {}  # request id -> target of a pending migration
        self.num_handoffs = 0
        self.num_requeued = 0
        self.num_model_swaps = 0
        self.num_evictions = 0  # asked of the instances by a queue router (QLM LSO 2)
        self._holder = router if isinstance(router, QueueRouter) else None
        self.operators = list(operators)

    # ---- requests in --------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Place a new request (or keep it in the global queue)."""
        if self._holder is not None:
            self.queue.append(req)
            self.dispatch_queue()
            return
        if not self._place(req, self.router.route(req, self.slots)):
            self.queue.append(req)

    def abort(self, request_id: str) -> bool:
        """Abort wherever the request is; False if the controller does not know it."""
        owned = self._owned.get(request_id)
        if owned is not None:
            self.slots[owned[0]].instance.abort(request_id)
            return True
        for req in self.queue:
            if req.request_id == request_id:
                self.queue.remove(req)
                return True
        return False

    def owner_of(self, request_id: str) -> int | None:
        owned = self._owned.get(request_id)
        return None if owned is None else owned[0]

    @property
    def holds_queue(self) -> bool:
        """The router orders the global queue itself (a `QueueRouter`)."""
        return self._holder is not None

    @property
    def num_owned(self) -> int:
        return len(self._owned)

    # ---- events from instances ----------------------------------------------------
    def on_step(self, index: int, finished_ids: Iterable[str] = (),
                handoffs: Sequence[Request] = ()) -> None:
        """Instance `index` finished a step: forget its finished requests, place the
        ones it handed back, then retry the global queue."""
        for rid in finished_ids:
            self.on_finished(rid)
        if handoffs:
            self.on_handoff(index, handoffs)
        if self.queue:
            self.dispatch_queue()
        self.after_step()

    def after_step(self) -> None:
        """Let the cluster operators act (the simulator calls it after every step)."""
        for operator in self.operators:
            operator.after_step(self)

    def on_finished(self, request_id: str) -> None:
        owned = self._owned.pop(request_id, None)
        if owned is not None and self._holder is not None:
            self._holder.on_finished(owned[1])
        self._moves.pop(request_id, None)

    def on_handoff(self, index: int, reqs: Sequence[Request]) -> None:
        """Requests instance `index` gave back: to their migration target, else where
        the router places them."""
        for req in reqs:
            rid = req.request_id
            self._owned.pop(rid, None)
            self.num_handoffs += 1
            target = self._moves.pop(rid, None)
            if target is None or not self.slots[target].alive:
                target = self.router.place_handoff(req, index, self.slots)
            if not self._place(req, target):
                self.queue.append(req)

    def dispatch_queue(self) -> None:
        """Place queued requests, oldest first, while the router accepts them (a
        `QueueRouter` chooses which)."""
        if self._holder is not None:
            self._apply(self._holder.dispatch(list(self.queue), self.slots))
            return
        while self.queue:
            req = self.queue[0]
            if not self._place(req, self.router.route(req, self.slots)):
                return
            self.queue.popleft()

    # ---- cluster operations -------------------------------------------------------
    def migrate(self, request_id: str, target: int) -> bool:
        """Move a request that has not started to instance `target`. Asynchronous: it
        moves when its owner gives it back; False if it is not owned elsewhere."""
        owned = self._owned.get(request_id)
        if owned is None or owned[0] == target or not self.slots[target].alive:
            return False
        self._moves[request_id] = target
        self.slots[owned[0]].instance.withdraw([request_id])
        return True

    def owned_by(self, index: int) -> list[Request]:
        """The unfinished requests instance `index` serves."""
        return [req for owner, req in self._owned.values() if owner == index]

    def reassign(self, source: int, target: int,
                 request_ids: Collection[str] | None = None) -> int:
        """Instance `target` now serves every request `source` held, or those of
        `request_ids` (KunServe: a group's leader took its members' requests; Llumnix:
        a running request migrated); returns how many."""
        moved = [(rid, req) for rid, (owner, req) in self._owned.items()
                 if owner == source and (request_ids is None or rid in request_ids)]
        for rid, req in moved:
            self._owned[rid] = (target, req)
        return len(moved)

    def instance_failed(self, index: int, started: Callable[[str], bool]) -> FailureOutcome:
        """Instance `index` is down: re-queue its requests that have not streamed a token
        (`started(id)` False), fail the others. Returns the ids of both."""
        slot = self.slots[index]
        slot.down = True
        slot.num_sent = 0
        outcome = FailureOutcome()
        lost = [(rid, req) for rid, (owner, req) in self._owned.items() if owner == index]
        for rid, req in lost:
            del self._owned[rid]
            self._moves.pop(rid, None)
            if started(rid):
                outcome.failed.append(rid)
                continue
            outcome.requeued.append(rid)
            self.num_requeued += 1
            self.submit(fresh_copy(req))
        return outcome

    def instance_recovered(self, index: int) -> None:
        """Instance `index` is serving again (a restarted actor starts empty)."""
        slot = self.slots[index]
        slot.down = False
        slot.num_sent = 0
        self.dispatch_queue()

    # ---- internals ----------------------------------------------------------------
    def _apply(self, decision: QueueDecision) -> None:
        for index, rid, mode in decision.evictions:
            instance = self.slots[index].instance
            if EVICT in instance.capabilities and self._owned.get(rid, (None,))[0] == index:
                self.num_evictions += 1
                instance.evict(rid, mode)
        for index, model in decision.swaps:
            instance = self.slots[index].instance
            if SWAP_MODEL in instance.capabilities:
                self.num_model_swaps += 1
                instance.swap_model(model)
        for index, model in decision.warm:
            multi = self.slots[index].multi_model
            if multi is not None:
                multi.warm_model(model)
        if not decision.placements:
            return
        by_id = {req.request_id: req for req in self.queue}
        placed = set()
        for rid, index in decision.placements:
            req = by_id.get(rid)
            if req is not None and rid not in placed and self._place(req, index):
                placed.add(rid)
        self.queue = deque(req for req in self.queue if req.request_id not in placed)

    def _place(self, req: Request, index: int | None) -> bool:
        if index is None:
            return False
        slot = self.slots[index]
        if not slot.alive:
            return False
        slot.num_sent += 1
        self._owned[req.request_id] = (index, req)
        slot.instance.submit(req)
        return True
