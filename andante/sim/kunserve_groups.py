"""KunServe's pipeline groups on simulated instances (the `PipelineGroups` seam).

Design note (KunServe §4.1, §4.2, §4.4 on andante.sim). Every instance is a
`KunSimInstance` (andante.sim.kunserve_instance), a pipeline instance of one stage while
ungrouped. Forming a group (`form_group`) waits until every involved instance is at a
step boundary (they start no new step meanwhile), then:
- the leader's block manager grows to the group's block count (`LayerMemory`: dropped
  weights become KV) and `adopt_group` moves every request into the leader's engine;
- the leader runs `len(members)` pipeline stages, each the step of its slice of layers;
- the KV exchange (§4.2): the bytes each member sends or receives for the adopted
  requests' moved blocks cross the link in chunks; the adopted requests stall until
  their KV has arrived (held in the scheduler), queued requests run meanwhile. With
  `kv_mode="recompute"` nothing moves: the running requests re-prefill at the leader.
Restoring (`dissolve_group`, §4.4) reloads the dropped layers over the link while the
group keeps serving, then (at a boundary with the pipeline drained and the requests
fitting one instance's blocks) moves the KV back to the leader, which alone keeps every
request, stalls them for that transfer and shrinks its block manager; the members come
back empty. A failed member (`fail_member`) makes its partners restore from host memory:
the group's requests are failed (started) or handed back for re-queueing (not started).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from andante.cluster.kunserve.adopt import KVMove, adopt_group, kv_moves, whole_model
from andante.cluster.kunserve.plan import LayerMemory
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import Request, RequestStatus
from andante.perf.links import LinkSpec
from andante.sim.kunserve_instance import KunSimInstance

EvictionCallback = Callable[[list[Request], list[Request]], None]


@dataclass(slots=True)
class GroupEvent:
    """One formation, restore or failure, for the report."""

    time: float
    kind: str  # "form", "restore", "fail"
    members: tuple[int, ...]
    num_adopted: int = 0
    num_recomputed: int = 0
    num_requeued: int = 0
    bytes_moved: int = 0
    transfer_seconds: float = 0.0


@dataclass(slots=True)
class _Restore:
    plan: GroupPlan
    reload_done: float


@dataclass(slots=True)
class SimPipelineGroups:
    """The `PipelineGroups` of a simulated cluster (see the module note)."""

    instances: list[KunSimInstance]
    memory: LayerMemory
    link: LinkSpec
    coordinated: bool = True
    lookahead: bool = True
    events: list[GroupEvent] = field(default_factory=list)
    _groups: dict[int, GroupPlan] = field(default_factory=dict)  # by leader
    _pending: list[GroupPlan] = field(default_factory=list)
    _restores: dict[int, _Restore] = field(default_factory=dict)
    _failures: dict[int, tuple[int, EvictionCallback]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for inst in self.instances:
            inst.groups = self
            inst.coordinated = self.coordinated
            inst.use_lookahead = self.lookahead

    # ---- the seam -------------------------------------------------------------------
    def groups(self) -> list[GroupPlan]:
        return list(self._groups.values())

    def form_group(self, plan: GroupPlan) -> bool:
        units = self._units_of(plan)
        if units is None or plan.num_layers != self.memory.num_layers:
            return False
        if self.memory.group_blocks(plan) < self._blocks_in_use(units):
            return False
        for leader in units:
            self._restores.pop(leader, None)  # throttled again: the restore is off
        self._pending.append(plan)
        for index in plan.members:
            self.instances[index].draining = True
            self.instances[index].runs = None
        self._try_pending()
        return True

    def dissolve_group(self, leader: int) -> bool:
        plan = self._groups.get(leader)
        if plan is None or leader in self._restores or self._involved_in_pending(leader):
            return False
        now = self.instances[leader].engine.clock.now()
        reload = self.link.transfer_time(self._reload_bytes(plan))
        self._restores[leader] = _Restore(plan, now + reload)
        self.instances[leader].hooks.wake_at(self.instances[leader], now + reload)
        return True

    def fail_member(self, index: int, on_evicted: EvictionCallback) -> None:
        """Instance `index` failed: at its group's next drained boundary the partners
        restore (from host memory), started requests fail with a reason, the others
        go to `on_evicted` for re-queueing."""
        leader = next((g.leader for g in self._groups.values() if index in g.members), None)
        if leader is None:
            raise ValueError(f"instance {index} is not in a pipeline group")
        self.instances[index].down = True
        self._failures[leader] = (index, on_evicted)
        self._restores.pop(leader, None)
        inst = self.instances[leader]
        inst.draining = True
        if not inst._pipeline:
            self.at_boundary(inst)

    # ---- boundaries -----------------------------------------------------------------
    def at_boundary(self, inst: KunSimInstance) -> None:
        """`inst` has no batch in flight: apply what waited for it."""
        if inst.index in self._failures and not inst._pipeline:
            self._apply_failure(inst.index)
            return
        self._try_pending()
        restore = self._restores.get(inst.index)
        if restore is not None and inst.engine.clock.now() >= restore.reload_done:
            if inst._pipeline:
                inst.draining = True
            else:
                self._finish_restore(inst, restore.plan)

    def _try_pending(self) -> None:
        still: list[GroupPlan] = []
        for plan in self._pending:
            if any(self.instances[i]._pipeline or self.instances[i].decode_run
                   for i in plan.members):
                still.append(plan)
            else:
                self._apply(plan)
        self._pending = still

    def _apply(self, plan: GroupPlan) -> None:
        units = self._units_of(plan, pending=True) or []
        leader = self.instances[plan.leader]
        now = leader.engine.clock.now()
        sources = [(self.instances[u].engine.scheduler, self._layout(u)) for u in units]
        for u in units:
            self._groups.pop(u, None)
        leader.engine.scheduler.kv.resize_device(self.memory.group_blocks(plan))
        adoption = adopt_group(sources, leader.engine.scheduler, plan)
        for index in plan.members:
            inst = self.instances[index]
            inst.draining = False
            if index != plan.leader:
                inst.become_solo(self.memory.num_blocks_whole)
                inst.leader = plan.leader
                inst.runs = None
        leader.become_stage_leader(plan, self.memory)
        self._groups[plan.leader] = plan
        num_bytes, seconds = self._exchange(leader, adoption.moves, now)
        leader.hold(sorted({m.request_id for m in adoption.moves}), now + seconds)
        self.events.append(GroupEvent(now, "form", plan.members, len(adoption.adopted),
                                      len(adoption.recomputed), len(adoption.requeued),
                                      num_bytes, seconds))
        leader.hooks.wake(leader)

    def _exchange(self, leader: KunSimInstance, moves: list[KVMove], now: float
                  ) -> tuple[int, float]:
        """Bytes moved and seconds the exchange occupies the link (the busiest NIC)."""
        if not moves:
            return 0, 0.0
        per_layer = self.memory.kv_block_bytes_per_layer
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        for move in moves:
            size = move.num_layers * per_layer
            if move.src_member != move.dst_member:
                sent[move.src_member] = sent.get(move.src_member, 0) + size
                received[move.dst_member] = received.get(move.dst_member, 0) + size
        busiest = max([*sent.values(), *received.values(), 0])
        seconds = self.link.transfer_time(busiest)
        leader.link_busy_until = now + seconds
        leader.chunk_seconds = leader.engine.executor.cost_model.decode_time(  # type: ignore[attr-defined]
            max(1, leader.engine.scheduler.num_running), 1024)
        return sum(sent.values()), seconds

    def _finish_restore(self, leader: KunSimInstance, plan: GroupPlan) -> None:
        scheduler = leader.engine.scheduler
        whole = self.memory.num_blocks_whole
        if scheduler.kv.num_device_blocks - scheduler.kv.num_free_device_blocks > whole:
            return  # the requests do not fit one instance yet: keep the group
        now = leader.engine.clock.now()
        layout = whole_model(leader.index, self.memory.num_layers)
        moves = [m for req in scheduler.running for m in kv_moves(
            req.request_id, plan, scheduler.kv.block_table(req.request_id), layout,
            scheduler.kv.block_table(req.request_id))]
        del self._restores[leader.index]
        del self._groups[leader.index]
        num_bytes, seconds = self._exchange(leader, moves, now)
        leader.draining = False
        leader.become_solo(whole)
        for index in plan.members[1:]:
            self.instances[index].become_solo(whole)
            self.instances[index].hooks.wake(self.instances[index])
        leader.hold(sorted({m.request_id for m in moves}), now + seconds)
        self.events.append(GroupEvent(now, "restore", plan.members, bytes_moved=num_bytes,
                                      transfer_seconds=seconds))
        leader.hooks.wake(leader)

    def _apply_failure(self, leader_index: int) -> None:
        failed, on_evicted = self._failures.pop(leader_index)
        plan = self._groups.pop(leader_index)
        leader = self.instances[leader_index]
        now = leader.engine.clock.now()
        scheduler = leader.engine.scheduler
        requeue: list[Request] = []
        failed_reqs: list[Request] = []
        for rid in list(scheduler.requests):
            leader.held.pop(rid, None)
            scheduler.release(rid)
            req = scheduler.detach(rid)
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
        leader.draining = False
        reload = self._reload_bytes(plan)
        for index in plan.members:
            inst = self.instances[index]
            inst.become_solo(self.memory.num_blocks_whole)
            if not inst.down:  # partners reload their dropped layers from host memory
                inst.stall_until = now + reload / inst.full_cost.hardware.host_link_bandwidth
                inst.hooks.wake_at(inst, inst.stall_until)
        self.events.append(GroupEvent(now, "fail", plan.members, num_requeued=len(requeue)))
        if failed_reqs:
            leader.hooks.finished(leader, failed_reqs)
        on_evicted(requeue, failed_reqs)

    # ---- helpers --------------------------------------------------------------------
    def _units_of(self, plan: GroupPlan, pending: bool = False) -> list[int] | None:
        """The serving units (solo instances, group leaders) `plan` merges; None if it
        splits a group, names a down or busy instance (`pending`: one of its own
        formation may drain), or its leader leads no unit."""
        units: list[int] = []
        for index in plan.members:
            if not 0 <= index < len(self.instances):
                return None
            inst = self.instances[index]
            if inst.down or (inst.draining and not pending) or inst.held:
                return None
            if inst.leader is None or inst.leader == index:
                units.append(index)
            elif inst.leader not in plan.members:
                return None
        for u in units:
            group = self._groups.get(u)
            if group is not None and not set(group.members) <= set(plan.members):
                return None
        return units if plan.leader in units else None

    def _layout(self, unit: int) -> GroupPlan:
        return self._groups.get(unit) or whole_model(unit, self.memory.num_layers)

    def _blocks_in_use(self, units: list[int]) -> int:
        return sum(self.instances[u].engine.scheduler.kv.num_device_blocks
                   - self.instances[u].engine.scheduler.kv.num_free_device_blocks
                   for u in units)

    def _reload_bytes(self, plan: GroupPlan) -> int:
        """The weight bytes of the member that dropped the most layers (§4.4: what its
        restore reloads; the members reload in parallel)."""
        return max((self.memory.num_layers - (end - start)) * self.memory.weight_bytes_per_layer
                   for start, end in plan.layer_slices)

    def _involved_in_pending(self, index: int) -> bool:
        return any(index in plan.members for plan in self._pending)

    def bubble_ratio(self) -> float | None:
        """Idle share of the stages while grouped work was in a pipeline (so far)."""
        capacity = sum(i.stage_capacity for i in self.instances)
        busy = sum(i.stage_busy for i in self.instances)
        return None if capacity <= 0 else max(0.0, 1.0 - busy / capacity)
