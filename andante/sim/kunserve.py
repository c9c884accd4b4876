"""`--router kunserve` in the simulator: KunServe's pipeline groups on the simulated clock.

Design note (KunServe §4.1, §4.2, §4.4 on andante.sim). The groups' state machine is
andante.cluster.kunserve.groups' `PipelineGroupBook`; `SimPipelineGroups` is its site,
over `KunSimInstance`s (andante.sim.kunserve_instance), and the `PipelineGroups` the
coordinator drives. What it adds is time:
- a formation waits until every involved instance is at a step boundary (they start no
  new step meanwhile: `draining`); the group's block count comes from `LayerMemory`
  (dropped weights become KV); a member keeps its whole pool, unused, while grouped;
- the KV exchange (§4.2): the bytes each member sends or receives for the moved blocks
  cross the link (the busiest member's bytes, andante.cluster.kunserve.exchange's
  `link_load`); the requests whose KV moves are held until it has arrived, queued
  requests run meanwhile (with `kv_mode="recompute"` nothing moves);
- a restore (§4.4) reloads the dropped layers over the link while the group keeps
  serving; then, at a boundary with the pipeline drained and the requests fitting one
  instance's blocks (the newest requests still prefilling are recomputed if that makes
  them fit; else it waits for some to finish), the KV moves back to the leader, which
  alone keeps every request; the members come back empty (the coordinator then spreads
  the leader's queue over them);
- a shrink by one (`shrink_group`, andante.cluster.kunserve.shrink) waits for the
  leader's drained boundary; the group's blocks fall to the smaller count, the leaving
  member's layers cross the link to the members that take them (their requests held)
  while it reloads what it dropped, then it serves alone;
- a failed member (`fail_member`) makes its partners restore from host memory at the
  group's next drained boundary: the group's requests are failed (started) or handed
  back for re-queueing (not started).
The cluster is the one `ClusterSpec` describes (each instance built by
`andante.sim.instances.build_instance`), re-wrapped as `KunSimInstance`s over an
inter-instance link, driven by the real `Controller` with a `KunServeCoordinator` as its
cluster operator. The router's counters (`SimReport.router_counters`) carry the
coordinator's counts and the groups' exchange figures and bubble ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from andante.cluster.controller import Controller
from andante.cluster.kunserve.adopt import Adoption, KVMove
from andante.cluster.kunserve.coordinator import EvictionCallback, KunServeCoordinator
from andante.cluster.kunserve.exchange import cheaper_kv_mode, link_load
from andante.cluster.kunserve.groups import PipelineGroupBook, evict_group, recompute
from andante.cluster.kunserve.plan import LayerMemory, layer_memory
from andante.cluster.kunserve.router import KunServeRouter
from andante.cluster.kunserve.seam import GroupPlan, KVMode
from andante.core.clock import ManualClock
from andante.core.request import Request
from andante.engine.scheduler import Scheduler
from andante.perf.links import LinkSpec, get_link
from andante.sim.instances import build_instance
from andante.sim.kunserve_instance import KunSimInstance
from andante.sim.simulator import Simulator
from andante.sim.spec import ClusterSpec


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
    grow: bool = False  # a "form" that added solo members to a formed group


@dataclass(slots=True)
class SimPipelineGroups:
    """The `PipelineGroups` of a simulated cluster, and the `GroupSite` of its book
    (see the module note)."""

    instances: list[KunSimInstance]
    memory: LayerMemory
    link: LinkSpec
    coordinated: bool = True
    lookahead: bool = True
    seq_scale: bool = True  # a group's sequence budget follows its KV
    events: list[GroupEvent] = field(default_factory=list)
    book: PipelineGroupBook = field(init=False)
    _reload_done: dict[int, float] = field(default_factory=dict)  # leader -> time
    _growing: bool = False  # the formation being joined adds to a formed group
    _failures: dict[int, tuple[int, EvictionCallback]] = field(default_factory=dict)
    _transfer: tuple[int, float] = (0, 0.0)  # the last exchange: bytes, seconds
    _moving_back: list[KVMove] = field(default_factory=list)  # a restore's, held in `leave`
    _shrinking: set[int] = field(default_factory=set)  # leaders to shrink when drained
    num_shed: int = 0  # prefilling requests recomputed to make room for restores

    def __post_init__(self) -> None:
        self.book = PipelineGroupBook(self, self.memory.num_layers)
        for inst in self.instances:
            inst.groups = self
            inst.coordinated = self.coordinated
            inst.use_lookahead = self.lookahead
            inst.scale_seqs = self.seq_scale

    # ---- the seam -------------------------------------------------------------------
    def groups(self) -> list[GroupPlan]:
        return self.book.plans()

    def form_group(self, plan: GroupPlan) -> bool:
        units = self.book.units_of(plan)
        if units is None or self.memory.group_blocks(plan) < self._blocks_in_use(units):
            return False
        self.book.propose(plan)
        for index in plan.members:
            self.instances[index].draining = True
            self.instances[index].runs = None
        self._try_pending()
        return True

    def dissolve_group(self, leader: int) -> bool:
        plan = self.book.ask_restore(leader)
        if plan is None:
            return False
        inst = self.instances[leader]
        done = inst.engine.clock.now() + self.link.transfer_time(self.memory.reload_bytes(plan))
        self._reload_done[leader] = done
        inst.hooks.wake_at(inst, done)
        return True

    def shrink_group(self, leader: int) -> bool:
        """Release the last member of the group `leader` leads at its next drained
        boundary (the coordinator's `ShrinkingGroups`); False if it has no group of
        three or more, or one is being restored or re-formed."""
        plan = self.book.groups.get(leader)
        if plan is None or len(plan.members) < 3 or leader in self.book.restoring \
                or leader in self._failures or any(leader in p.members
                                                   for p in self.book.pending):
            return False
        self._shrinking.add(leader)
        inst = self.instances[leader]
        inst.draining = True
        if not inst._pipeline:
            self.at_boundary(inst)
        return True

    def fail_member(self, index: int, on_evicted: EvictionCallback) -> None:
        """Instance `index` failed: at its group's next drained boundary the partners
        restore (from host memory), started requests fail with a reason, the others
        go to `on_evicted` for re-queueing."""
        leader = self.book.leader_of(index)
        if leader is None:
            raise ValueError(f"instance {index} is not in a pipeline group")
        self.instances[index].down = True
        self._failures[leader] = (index, on_evicted)
        self.book.restoring.discard(leader)
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
        group = self.book.groups.get(inst.index)
        self._try_pending()
        if inst.index in self._shrinking and self.book.groups.get(inst.index) is not group:
            self._shrinking.discard(inst.index)  # a grow just re-formed the group: the
            inst.draining = False  # shrink was decided for the old one (the coordinator
            # decides again on the new group)
        if inst.index in self._shrinking and not inst._pipeline:
            self._shrinking.discard(inst.index)
            self.book.shrink(inst.index)  # (None: no longer fits; the group stays)
            inst.draining = False
        if inst.index in self.book.restoring \
                and inst.engine.clock.now() >= self._reload_done[inst.index]:
            if inst._pipeline:
                inst.draining = True
            elif not self.book.restore(self.book.groups[inst.index]):
                inst.draining = False  # not fitting yet: serve on (admitting none), retry

    def between_steps(self, inst: KunSimInstance) -> None:
        """A step of `inst` finished with more in its pipeline. A restore whose reload is
        done waits for no idle moment (under sustained load there is none): once its
        requests can be made to fit (`make_room`), the pipeline drains for it."""
        if inst.index in self.book.restoring \
                and inst.engine.clock.now() >= self._reload_done[inst.index] \
                and self._prefills_to_shed(inst) is not None:
            inst.draining = True

    def _try_pending(self) -> None:
        for plan in list(self.book.pending):
            if not any(self.instances[i]._pipeline or self.instances[i].decode_run
                       for i in plan.members):
                self.book.form(plan)

    def _apply_failure(self, leader_index: int) -> None:
        failed, on_evicted = self._failures.pop(leader_index)
        plan = self.book.drop(leader_index)
        assert plan is not None
        leader = self.instances[leader_index]
        now = leader.engine.clock.now()
        for rid in leader.engine.scheduler.requests:
            leader.held.pop(rid, None)
        requeue, failed_reqs = evict_group(leader.engine.scheduler, now, failed)
        leader.draining = False
        reload = self.memory.reload_bytes(plan)
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

    # ---- the GroupSite --------------------------------------------------------------
    def scheduler(self, index: int) -> Scheduler:
        return self.instances[index].engine.scheduler

    def can_join(self, index: int, pending: bool) -> bool:
        if not 0 <= index < len(self.instances):
            return False
        inst = self.instances[index]
        return not (inst.down or (inst.draining and not pending) or inst.held)

    def group_blocks(self, plan: GroupPlan) -> int:
        return self.memory.group_blocks(plan)

    def resize(self, index: int, num_blocks: int) -> None:
        self.instances[index].engine.scheduler.kv.resize_device(num_blocks)

    def join(self, plan: GroupPlan, moved: Mapping[int, list[Request]]) -> None:
        self._growing = self.instances[plan.leader].grouped
        for index in plan.members:
            inst = self.instances[index]
            inst.draining = False
            if index != plan.leader:
                inst.become_solo(self.memory.num_blocks_whole)
                inst.leader = plan.leader
                inst.runs = None
        self.instances[plan.leader].become_stage_leader(plan)

    def exchange(self, plan: GroupPlan, moves: list[KVMove], adoption: Adoption | None
                 ) -> None:
        """The moves occupy the link (their requests are held from `leave` when
        restoring, at once when forming)."""
        leader = self.instances[plan.leader]
        now = leader.engine.clock.now()
        self._transfer = self._occupy_link(leader, moves, now)
        if adoption is None:
            self._moving_back = moves
            return
        num_bytes, seconds = self._transfer
        leader.hold(sorted({m.request_id for m in moves}), now + seconds)
        self.events.append(GroupEvent(now, "form", plan.members, len(adoption.adopted),
                                      len(adoption.recomputed), len(adoption.requeued),
                                      num_bytes, seconds, self._growing))
        leader.hooks.wake(leader)

    def _occupy_link(self, leader: KunSimInstance, moves: list[KVMove], now: float
                     ) -> tuple[int, float]:
        """Bytes moved and seconds the exchange occupies the link (the busiest NIC)."""
        if not moves:
            return 0, 0.0
        load = link_load(moves, self.memory.kv_block_bytes_per_layer)
        seconds = self.link.transfer_time(load.busiest_bytes)
        leader.link_busy_until = now + seconds
        leader.chunk_seconds = leader.engine.executor.cost_model.decode_time(  # type: ignore[attr-defined]
            max(1, leader.engine.scheduler.num_running), 1024)
        return load.bytes_sent, seconds

    def settle(self, plan: GroupPlan, lost: bool) -> None:
        return None  # a formation's exchange is modelled time: nothing left to run

    def make_room(self, plan: GroupPlan, failed: int | None) -> bool:
        """Make the requests fit one instance's blocks: recompute the newest requests
        still prefilling (they lose only prompt work, and go back to the queue the
        members will share) if that is enough; else wait for some to finish."""
        leader = self.instances[plan.leader]
        shed = self._prefills_to_shed(leader)
        if shed is None:
            return False
        scheduler, now = leader.engine.scheduler, leader.engine.clock.now()
        for req in shed:
            leader.held.pop(req.request_id, None)
            scheduler.release(req.request_id)
            recompute(scheduler, req, now)
        self.num_shed += len(shed)
        return True

    def _prefills_to_shed(self, leader: KunSimInstance) -> list[Request] | None:
        """The newest prefilling requests whose blocks, freed, make the rest fit one
        instance ([]: they fit already); None if freeing every prefill is not enough."""
        kv = leader.engine.scheduler.kv
        excess = self._blocks_in_use([leader.index]) - self.memory.num_blocks_whole
        shed: list[Request] = []
        for req in reversed(leader.engine.scheduler.running):
            if excess <= 0:
                break
            if req.num_output_tokens == 0:
                shed.append(req)
                excess -= kv.num_device_blocks_of(req.request_id)
        return shed if excess <= 0 else None

    def leave(self, plan: GroupPlan, failed: int | None) -> None:
        leader = self.instances[plan.leader]
        now = leader.engine.clock.now()
        whole = self.memory.num_blocks_whole
        leader.draining = False
        leader.become_solo(whole)
        for index in plan.members[1:]:
            self.instances[index].become_solo(whole)
            self.instances[index].hooks.wake(self.instances[index])
        num_bytes, seconds = self._transfer
        leader.hold(sorted({m.request_id for m in self._moving_back}), now + seconds)
        self.events.append(GroupEvent(now, "restore", plan.members, bytes_moved=num_bytes,
                                      transfer_seconds=seconds))
        leader.hooks.wake(leader)

    def shrink_to(self, plan: GroupPlan, smaller: GroupPlan, moves: list[KVMove]) -> None:
        """The leader runs `smaller`'s stages; the leaving member's layers cross the
        link to their new holders (their requests held meanwhile) while it reloads the
        layers it dropped (the busier of the two occupies it) and then serves alone."""
        leader = self.instances[plan.leader]
        now = leader.engine.clock.now()
        leader.become_stage_leader(smaller)
        num_bytes, seconds = self._occupy_link(leader, moves, now)
        leader.hold(sorted({m.request_id for m in moves}), now + seconds)
        leaving = self.instances[plan.members[-1]]
        leaving.become_solo(self.memory.num_blocks_whole)
        reload = self.memory.num_layers - (plan.layer_slices[-1][1] - plan.layer_slices[-1][0])
        leaving.stall_until = now + max(seconds, self.link.transfer_time(
            reload * self.memory.weight_bytes_per_layer))
        leaving.hooks.wake_at(leaving, leaving.stall_until)
        self.events.append(GroupEvent(now, "shrink", plan.members, bytes_moved=num_bytes,
                                      transfer_seconds=seconds))
        leader.hooks.wake(leader)

    # ---- helpers --------------------------------------------------------------------
    def _blocks_in_use(self, units: list[int]) -> int:
        return sum(self.instances[u].engine.scheduler.kv.num_device_blocks
                   - self.instances[u].engine.scheduler.kv.num_free_device_blocks
                   for u in units)

    def bubble_ratio(self) -> float | None:
        """Idle share of the stages while grouped work was in a pipeline (so far)."""
        capacity = sum(i.stage_capacity for i in self.instances)
        busy = sum(i.stage_busy for i in self.instances)
        return None if capacity <= 0 else max(0.0, 1.0 - busy / capacity)


@dataclass(slots=True)
class KunServeCounters:
    """`SimReport.router_counters` of a KunServe run."""

    coordinator: KunServeCoordinator
    groups: SimPipelineGroups

    def summary(self) -> dict[str, int]:
        out = self.coordinator.counters.summary()
        forms = [e for e in self.groups.events if e.kind == "form"]
        out["kv_bytes_exchanged"] = sum(e.bytes_moved for e in self.groups.events)
        out["num_adopted_running"] = sum(e.num_adopted for e in forms)
        out["num_recomputed_running"] = sum(e.num_recomputed for e in forms)
        out["num_grows"] = sum(1 for e in forms if e.grow)
        out["exchange_ms"] = round(1000 * sum(e.transfer_seconds for e in forms))
        ratio = self.groups.bubble_ratio()
        out["bubble_permille"] = -1 if ratio is None else round(1000 * ratio)
        out["num_shed_for_restore"] = self.groups.num_shed
        return out


def kv_mode_by_cost(groups: SimPipelineGroups) -> Callable[[GroupPlan], KVMode]:
    """A chooser for the coordinator: exchange unless re-prefilling costs less."""

    def choose(plan: GroupPlan) -> KVMode:
        tokens = sum(groups.instances[i].engine.stats().num_tokens for i in plan.members)
        return cheaper_kv_mode(tokens, len(plan.members),
                               groups.instances[plan.leader].full_cost, groups.link)

    return choose


def build_kunserve_simulator(spec: ClusterSpec, router: KunServeRouter,
                             decode_runs: bool = True) -> Simulator:
    clock = ManualClock()
    settings = router.settings
    link: LinkSpec = get_link(settings.link)
    plain = [build_instance(spec, i, clock) for i in range(spec.num_instances)]
    instances = [KunSimInstance(p.index, p.engine, p.runs, link, spec.tp) for p in plain]
    for inst in instances:
        inst.configure(spec.role_of(inst.index), spec.drop_late)
    first = instances[0]
    memory = layer_memory(first.full_cost, first.engine.scheduler.kv.num_device_blocks,
                          spec.scheduler.block_size)
    groups = SimPipelineGroups(instances, memory, link, coordinated=settings.coordinated,
                               lookahead=settings.lookahead,
                               seq_scale=settings.seq_scale)
    coordinator = KunServeCoordinator(
        groups, memory, spec.scheduler.block_size, settings.monitor,
        kv_mode=settings.kv_mode,  # type: ignore[arg-type]
        choose_kv_mode=kv_mode_by_cost(groups),
        max_members=settings.max_members, restore=settings.restore)
    router.counters = KunServeCounters(coordinator, groups)  # type: ignore[attr-defined]
    operators = (coordinator,) if settings.drop else ()
    controller = Controller(instances, router, operators)
    return Simulator(list(instances), controller, clock, decode_runs)
