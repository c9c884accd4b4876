"""KunServe's pipeline groups, once for both clocks: which exist, which wait, and the
steps of forming and restoring one (§4.1, §4.2, §4.4; DESIGN.md §4 "One instance, two
clocks").

Design note. `PipelineGroupBook` is the state machine behind the `PipelineGroups` seam
(andante.cluster.kunserve.seam). It keeps the groups (by leader), the formations that
wait for a step boundary of all their members, and the restores under way, and it
carries out both operations in one order, asking its `GroupSite` (the simulator's
`SimPipelineGroups`, the runtime's `LocalPipelineGroups`) for what only a transport can
do: resize a block pool, switch executors or cost models, move KV bytes (copied, or
modelled on a link), wait (on the simulated clock, or on threads). No threads, no clock.

Forming `plan` (`propose`, then `form` at a step boundary of every member):
1. the units it merges: ungrouped members, or whole groups (`units_of`; a plan that
   splits a group, names an instance that cannot join, or merges groups where the site
   cannot, is refused; a site that cannot merge groups may still grow one: solo
   members appended to a formed group that keeps its leader, `is_grow`);
2. the leader's block manager grows to the group's block count (the dropped weights'
   memory becomes KV);
3. every unit's requests move into the leader's scheduler (`adopt_group`: waiting ones
   re-queued, running ones adopted with a new block table and their KV moves listed, or
   recomputed under `kv_mode="recompute"`);
4. the members serve as stages of the leader (`GroupSite.join`);
5. the KV moves run (`GroupSite.exchange`), their requests held until their KV arrived.
Restoring (`ask_restore` once the reload of the dropped layers is under way, then
`restore` at a step boundary): the exchange still running settles (`settle`), the
requests are made to fit the leader's own pool (`make_room`: the simulator waits for
them to finish, the runtime recomputes the newest), the KV moves back to the leader
(`moves_back`, `exchange`) and every member serves alone again (`leave`); requests stay
at the leader. A failed member restores its group without it (`restore(failed=...)`:
every request holding KV is recomputed at the leader) or has it evicted
(`evict_group`: started requests fail with a reason, the others are re-queued), as the
site chooses; a failed leader's group is forgotten (`drop`). Shrinking by one (`shrink`,
at a step boundary of the leader and its last member): the group's block count falls
to the smaller member list's, the last member's layers move to the others and it serves
alone again (andante.cluster.kunserve.shrink decides when).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from andante.cluster.kunserve.adopt import Adoption, KVMove, adopt_group, kv_moves, whole_model
from andante.cluster.kunserve.seam import GroupPlan
from andante.cluster.kunserve.shrink import shrunk
from andante.core.request import Request, RequestStatus
from andante.engine.scheduler import Scheduler


class GroupSite(Protocol):
    """The instances a `PipelineGroupBook` reconfigures (contract; every call comes at a
    step boundary of the instances it names, with no batch of theirs in flight).

    `scheduler(i)`: instance i's scheduler. `can_join(i, pending)`: may instance i join a
    group now (it exists and serves; `pending`: its own formation may be waiting for
    it). `group_blocks(plan)`: the group's KV block count. `resize(i, n)`: instance i's
    block manager to n device blocks. `join(plan, moved)`: the members serve as the
    leader's stages (`moved`: each other unit's requests, now the leader's).
    `exchange(plan, moves, adoption)`: carry out the KV `moves` (forming, with its
    `adoption`; restoring: None), holding their requests until their KV has arrived.
    `settle(plan, lost)`: finish (or, with a member's layers `lost`, drop) what remains
    of the formation's exchange. `make_room(plan, failed)`: make the group's requests
    fit the leader's own pool (every request holding KV recomputed if a member
    `failed`); False: not now, the restore waits. `leave(plan, failed)`: every member
    but `failed` serves alone again with all its layers. `shrink_to(plan, smaller,
    moves)`: see the method."""

    def scheduler(self, index: int) -> Scheduler: ...

    def can_join(self, index: int, pending: bool) -> bool: ...

    def group_blocks(self, plan: GroupPlan) -> int: ...

    def resize(self, index: int, num_blocks: int) -> None: ...

    def join(self, plan: GroupPlan, moved: Mapping[int, list[Request]]) -> None: ...

    def exchange(self, plan: GroupPlan, moves: list[KVMove],
                 adoption: Adoption | None) -> None: ...

    def settle(self, plan: GroupPlan, lost: bool) -> None: ...

    def make_room(self, plan: GroupPlan, failed: int | None) -> bool: ...

    def leave(self, plan: GroupPlan, failed: int | None) -> None: ...

    def shrink_to(self, plan: GroupPlan, smaller: GroupPlan, moves: list[KVMove]) -> None:
        """The group `plan` runs as `smaller` (its last member gone) from now: its
        stages re-split, the KV `moves` carried out (the leaving member's layers to
        their new holders), the leaving member serving alone again."""


class PipelineGroupBook:
    """The groups of one cluster and the operations under way (see the module note).
    `merges`: whether a plan may merge existing groups (the simulator's stages can be
    re-cut); `grows`: whether a plan may add solo members to one formed group that keeps
    leading it (`is_grow`; the real engine re-splits its stages, andante.exec.
    torch_regroup), which `merges` allows too."""

    def __init__(self, site: GroupSite, num_layers: int, merges: bool = True,
                 grows: bool = True) -> None:
        self.site = site
        self.num_layers = num_layers
        self.merges = merges
        self.grows = grows
        self.groups: dict[int, GroupPlan] = {}  # by leader
        self.pending: list[GroupPlan] = []  # formations waiting for a step boundary
        self.restoring: set[int] = set()  # leaders whose restore is under way

    # ---- the seam's questions -------------------------------------------------------
    def plans(self) -> list[GroupPlan]:
        return list(self.groups.values())

    def leader_of(self, index: int) -> int | None:
        return next((g.leader for g in self.groups.values() if index in g.members), None)

    def accepting(self, index: int) -> bool:
        """False for a member that is not its group's leader."""
        leader = self.leader_of(index)
        return leader is None or leader == index

    def layout(self, unit: int) -> GroupPlan:
        """How a serving unit holds its layers: its group, or every layer alone."""
        return self.groups.get(unit) or whole_model(unit, self.num_layers)

    # ---- forming --------------------------------------------------------------------
    def units_of(self, plan: GroupPlan, pending: bool = False) -> list[int] | None:
        """The serving units (solo instances, group leaders) `plan` merges; None if it
        has fewer than two members or covers other layers, splits a group, merges
        groups where that cannot be done, names an instance that cannot join, or its
        leader leads no unit (`pending`: the plan's own formation is waiting)."""
        if len(plan.members) < 2 or plan.num_layers != self.num_layers:
            return None
        waiting = set() if pending else {m for p in self.pending for m in p.members}
        units: list[int] = []
        for index in plan.members:
            if index in waiting or not self.site.can_join(index, pending):
                return None
            leader = self.leader_of(index)
            if leader is None or leader == index:
                units.append(index)
            elif leader not in plan.members:
                return None
        for u in units:
            group = self.groups.get(u)
            if group is not None and not set(group.members) <= set(plan.members):
                return None
        formed = [u for u in units if u in self.groups]
        if formed and not self.merges and not (self.grows and self.is_grow(plan)):
            return None
        return units if plan.leader in units else None

    def is_grow(self, plan: GroupPlan) -> bool:
        """Does `plan` add solo instances to the group its leader leads now, that
        group's members first in their order (the others append, balanced slices)?"""
        group = self.groups.get(plan.leader)
        if group is None or len(plan.members) <= len(group.members):
            return False
        joiners = plan.members[len(group.members):]
        return plan.members[:len(group.members)] == group.members and all(
            self.leader_of(j) is None for j in joiners)

    def propose(self, plan: GroupPlan) -> list[int] | None:
        """Take `plan` in (it waits for its members' step boundary): its units, or None
        if it cannot form. A restore under way of a unit it merges is called off."""
        units = self.units_of(plan)
        if units is None:
            return None
        self.restoring -= set(units)
        self.pending.append(plan)
        return units

    def cancel(self, plan: GroupPlan) -> None:
        """`plan` will not form after all."""
        if plan in self.pending:
            self.pending.remove(plan)

    def form(self, plan: GroupPlan) -> Adoption | None:
        """Form the proposed `plan` now (the module note's steps 1-5); None if it cannot
        form any more (an instance failed meanwhile: the plan is dropped)."""
        self.cancel(plan)
        units = self.units_of(plan, pending=True)
        if units is None:
            return None
        site, leader = self.site, plan.leader
        sources = [(site.scheduler(u), self.layout(u)) for u in units]
        moved = {u: list(site.scheduler(u).requests.values()) for u in units if u != leader}
        for u in units:
            self.groups.pop(u, None)
        site.resize(leader, site.group_blocks(plan))
        adoption = adopt_group(sources, site.scheduler(leader), plan)
        site.join(plan, moved)
        self.groups[leader] = plan
        site.exchange(plan, adoption.moves, adoption)
        return adoption

    # ---- restoring ------------------------------------------------------------------
    def ask_restore(self, leader: int) -> GroupPlan | None:
        """Start restoring the group `leader` leads (its reload under way): the group,
        or None if there is none, it is restoring already or a formation waits on it."""
        plan = self.groups.get(leader)
        if plan is None or leader in self.restoring or any(
                leader in p.members for p in self.pending):
            return None
        self.restoring.add(leader)
        return plan

    def restore(self, plan: GroupPlan, failed: int | None = None) -> bool:
        """Restore `plan` now (its reload is done); False if its requests do not fit the
        leader's own pool yet (`make_room`) or it is gone."""
        if self.groups.get(plan.leader) is not plan:
            return False
        site = self.site
        site.settle(plan, lost=failed is not None)
        if not site.make_room(plan, failed):
            return False
        moves = moves_back(plan, site.scheduler(plan.leader))
        del self.groups[plan.leader]
        self.restoring.discard(plan.leader)
        site.exchange(plan, moves, None)
        site.leave(plan, failed)
        return True

    # ---- shrinking by one (andante.cluster.kunserve.shrink) ---------------------------
    def shrink(self, leader: int) -> GroupPlan | None:
        """Let the last member of the group `leader` leads go now (at a step boundary
        of the leader and that member): the exchange still running settles, the
        leader's block manager shrinks to the smaller group's count (blocks in use
        relocated below it), the KV of the leaving member's layers moves to the members
        that hold them now, and the site re-splits the stages (`shrink_to`). Returns
        the smaller group; None if there is no group of three or more, it is restoring
        or being re-formed, or its blocks in use do not fit the smaller count."""
        plan = self.groups.get(leader)
        smaller = None if plan is None else shrunk(plan)
        if plan is None or smaller is None or leader in self.restoring or any(
                leader in p.members for p in self.pending):
            return None
        site = self.site
        num_blocks = site.group_blocks(smaller)
        kv = site.scheduler(leader).kv
        if kv.num_device_blocks - kv.num_free_device_blocks > num_blocks:
            return None
        site.settle(plan, lost=False)
        site.resize(leader, num_blocks)
        scheduler = site.scheduler(leader)
        moves = [m for req in scheduler.running for m in kv_moves(
            req.request_id, plan, scheduler.kv.block_table(req.request_id), smaller,
            scheduler.kv.block_table(req.request_id))]
        self.groups[leader] = smaller
        site.shrink_to(plan, smaller, moves)
        return smaller

    def drop(self, leader: int) -> GroupPlan | None:
        """Forget the group `leader` led (its leader failed, or it was evicted)."""
        self.restoring.discard(leader)
        return self.groups.pop(leader, None)


def moves_back(plan: GroupPlan, leader: Scheduler) -> list[KVMove]:
    """The copies that bring every running request's KV from the group's stages back
    to the leader holding every layer (same block ids)."""
    layout = whole_model(plan.leader, plan.num_layers)
    return [m for req in leader.running for m in kv_moves(
        req.request_id, plan, leader.kv.block_table(req.request_id), layout,
        leader.kv.block_table(req.request_id))]


def evict_group(leader: Scheduler, now: float, failed: int
                ) -> tuple[list[Request], list[Request]]:
    """A member's layers are lost: take every request out of the leader's scheduler.
    Returns (the requests that never streamed a token, to re-queue; the started ones,
    finished as aborted with the reason)."""
    requeue: list[Request] = []
    failed_reqs: list[Request] = []
    for rid in list(leader.requests):
        leader.release(rid)
        req = leader.detach(rid)
        if req is None:
            continue
        if req.num_output_tokens:
            req.finish(RequestStatus.FINISHED_ABORTED, now)
            req.timeline.rejection_reason = (
                f"instance {failed} of its pipeline group failed after the request "
                "started streaming")
            failed_reqs.append(req)
        else:
            requeue.append(req)
    return requeue, failed_reqs


def recompute(scheduler: Scheduler, req: Request, now: float) -> None:
    """Drop a request's KV; it re-queues at the front, its output so far kept."""
    scheduler.release(req.request_id)
    scheduler.detach(req.request_id)
    req.preempt_by_recompute(now)
    scheduler.adopt(req)


def shed(scheduler: Scheduler, num_blocks: int, everything: bool, now: float) -> int:
    """Fit the requests into `num_blocks` device blocks: recompute the swapped ones (a
    group's host KV stays in its stages), every running one if `everything` (a member's
    layers are lost), else the newest running ones until the rest fit. Returns how many."""
    victims = [r for r in scheduler.requests.values()
               if r.status == RequestStatus.SWAPPED
               or (everything and r.status == RequestStatus.RUNNING)]
    for req in victims:
        recompute(scheduler, req, now)
    count = len(victims)
    kv = scheduler.kv
    while kv.num_device_blocks - kv.num_free_device_blocks > num_blocks:
        recompute(scheduler, scheduler.running[-1], now)
        count += 1
    return count
