"""KunServe's pipeline groups on simulated instances (the `PipelineGroups` seam).

Design note (KunServe §4.1-§4.4 on andante.sim). Every instance is a `KunSimInstance`,
a pipeline instance of one stage while ungrouped. Forming a group (`form_group`) waits
until every involved instance is at a step boundary (they start no new step meanwhile),
then:
- the leader's block manager grows to the group's block count (`LayerMemory`: dropped
  weights become KV) and `adopt_group` moves every request into the leader's engine;
- the leader runs `len(members)` pipeline stages (andante.sim.pipeline): each stage
  costs the step of its slice of layers (the largest slice, from the cost model), and
  hidden states cross an inter-instance link (`andante.perf.links`) between stages;
  unbalanced microbatches leave bubbles, which `bubble_ratio` reports;
- the KV exchange (§4.2): the bytes each member sends or receives for the adopted
  requests' moved blocks cross the link in chunks; the adopted requests stall until
  their KV has arrived (held in the scheduler), queued requests run meanwhile.
  Coordinated (the paper's design), an activation waits at most for the chunk on the
  wire (a chunk lasts about one stage step); uncoordinated, activations queue behind
  the whole exchange. With `kv_mode="recompute"` nothing moves: the running requests
  re-prefill at the leader.
Restoring (`dissolve_group`, §4.4) reloads the dropped layers over the link while the
group keeps serving, then (at a boundary with the pipeline drained and the requests
fitting one instance's blocks) moves the KV back to the leader, which alone keeps every
request, stalls them for that transfer and shrinks its block manager; the members come
back empty. A failed member (`fail_member`) makes its partners restore from host memory:
the group's requests are failed (started) or handed back for re-queueing (not started).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from andante.cluster.kunserve.adopt import KVMove, adopt_group, kv_moves, whole_model
from andante.cluster.kunserve.lookahead import ChunkCostModel, WorkItem, form_microbatches
from andante.cluster.kunserve.plan import LayerMemory
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import Request, RequestStatus
from andante.engine.config import SchedulerConfig
from andante.engine.engine import Engine, StepOutput
from andante.exec.base import DecodeRunExecutor
from andante.exec.batch import StepBatch
from andante.perf.cost_model import CostModel
from andante.perf.links import LinkSpec
from andante.perf.shape import BatchShape
from andante.sim.pipeline import PipelineSimInstance

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


def fit_chunk_cost(cost: CostModel) -> ChunkCostModel:
    """Eq. (1)'s alpha, beta, gamma fitted (least squares) to the cost model's step
    times over prefill chunks and decode batches: the paper profiles them offline."""
    rows: list[tuple[float, float, float]] = []
    times: list[float] = []
    for prefix in (0, 512, 2048, 8192):
        for tokens in (1, 64, 512, 2048):
            rows.append((prefix * tokens + (tokens * tokens + tokens) / 2, tokens, 1.0))
            times.append(cost.prefill_time(tokens, prefix))
    for batch in (8, 64, 256):
        for context in (256, 2048):
            shape = BatchShape(num_seqs=batch, num_tokens=batch, num_sampled=batch,
                               num_decode_seqs=batch, attn_pairs=float(batch * (context + 1)),
                               kv_tokens_read=batch * (context + 1))
            rows.append((batch * (context + 1), batch, 1.0))
            times.append(cost.step_time(shape))
    solution = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)[0]
    alpha, beta, gamma = (max(0.0, float(v)) for v in solution)
    return ChunkCostModel(alpha, beta, gamma)


class KunSimInstance(PipelineSimInstance):
    """A simulated instance that can lead or join a KunServe pipeline group."""

    def __init__(self, index: int, engine: Engine, runs: DecodeRunExecutor | None,
                 link: LinkSpec, tp: int = 1) -> None:
        super().__init__(index, engine, 1, 0.0, 0.0)
        self._init_group_state(runs, link, tp)

    def _init_group_state(self, runs: DecodeRunExecutor | None, link: LinkSpec,
                          tp: int) -> None:
        self.solo_runs = runs
        self.runs = runs
        self.link = link
        self.tp = tp
        self.full_cost: CostModel = self.engine.executor.cost_model  # type: ignore[attr-defined]
        self.leader: int | None = None  # the group's leader while grouped
        self.down = False
        self.draining = False  # a group operation waits for this boundary
        self.stall_until = -math.inf
        self.held: dict[str, float] = {}  # request id -> time its KV is in place
        self.link_busy_until = -math.inf  # a KV exchange occupies the link
        self.chunk_seconds = 0.0
        self.coordinated = True
        self.groups: SimPipelineGroups | None = None
        self.use_lookahead = False  # balance microbatches (§4.3) while grouped
        self.lookahead: ChunkCostModel | None = None
        self.base_config = self.engine.scheduler.config
        self.stage_busy = 0.0  # stage-seconds computed while grouped
        self.stage_capacity = 0.0  # stage-seconds while the grouped pipeline held work
        self._open_since: float | None = None

    # ---- the Instance seam ----------------------------------------------------------
    @property
    def alive(self) -> bool:
        # draining: a group operation waits for this instance's boundary; new requests
        # go elsewhere meanwhile
        return not self.down and not self.draining and (
            self.leader is None or self.leader == self.index)

    @property
    def is_member(self) -> bool:
        return self.leader is not None and self.leader != self.index

    @property
    def grouped(self) -> bool:
        return self.num_stages > 1

    # ---- stepping -------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        now = self.engine.clock.now()
        if self.decode_run is not None or now < self.stall_until:
            return True
        # (a tolerance: a batch's return and a stage's release computed along
        # different sums must not read as "stage still busy" and idle the pipeline)
        return len(self._pipeline) >= self.num_stages or now + 1e-9 < self._stage_free[0]

    def begin_step(self, now: float) -> float | None:
        if self.groups is not None and not self._pipeline:
            self.groups.at_boundary(self)
        if self.draining or self.down or self.is_member:
            return None
        self._release_ready(now)
        if self.grouped and self.lookahead is not None:
            self._size_microbatch(self.lookahead)
        was_empty = not self._pipeline
        done = super().begin_step(now)
        if done is not None and self.grouped:
            per_stage = self._pipeline[-1][1].duration
            self.stage_busy += per_stage * self.num_stages
            if was_empty:
                self._open_since = now
        return done

    def finish_step(self) -> tuple[StepBatch, StepOutput]:
        if self.decode_run is not None:
            out = self._finish_decode_run(*self.decode_run)
        else:
            out = super().finish_step()
        if not self._pipeline:
            if self._open_since is not None:
                elapsed = self.engine.clock.now() - self._open_since
                self.stage_capacity += elapsed * self.num_stages
                self._open_since = None
            if self.groups is not None:
                self.groups.at_boundary(self)
        return out

    def _hop_done(self, start: float, hop: float) -> float:
        if start >= self.link_busy_until:
            return start + hop
        if self.coordinated:  # waits for the KV chunk on the wire, then goes first
            return start + min(self.chunk_seconds, self.link_busy_until - start) + hop
        return self.link_busy_until + hop  # queued behind the whole exchange

    def _size_microbatch(self, model: ChunkCostModel) -> None:
        """Cap this step at the first of the balanced microbatches that Figure 11 forms
        from a cycle's worth of work (the running requests' next tokens and the queued
        prompts that fit); the policy fills the step in its own order up to the caps."""
        scheduler, base = self.engine.scheduler, self.group_config()
        budget = base.max_num_batched_tokens * self.num_stages
        items = [WorkItem(r.request_id, r.num_computed_tokens, max(1, r.num_uncomputed_tokens),
                          r.num_uncomputed_tokens > 1) for r in scheduler.running]
        num_tokens = sum(i.tokens for i in items)
        free = scheduler.kv.num_free_device_blocks
        for req in scheduler.waiting:
            need = scheduler.kv.num_blocks_for(req.num_tokens)
            if need > free or num_tokens >= budget:
                break
            free -= need
            tokens = min(req.num_uncomputed_tokens, budget - num_tokens)
            items.append(WorkItem(req.request_id, req.num_computed_tokens, tokens))
            num_tokens += tokens
        batches = form_microbatches(items, model, self.num_stages,
                                    min_tokens=base.block_size)
        if not batches:
            scheduler.config = base
            return
        # only the token budget is capped: max_num_seqs also caps the running set
        # (admission), which must stay the group's (see `group_config`)
        first = batches[0]
        scheduler.config = dataclasses.replace(
            base, max_num_batched_tokens=max(1, min(base.max_num_batched_tokens,
                                                    sum(i.tokens for i in first))))

    def group_config(self) -> SchedulerConfig:
        """The leader's budgets while grouped: a step (one microbatch) keeps one
        instance's budgets, while the running set may hold `num_stages` x max_num_seqs
        (the members' requests were adopted; as in vLLM's pipeline parallelism, each
        microbatch in flight has its own sequence budget). With one instance's cap the
        group could not admit a queued request until its running set fell below 256."""
        base = self.base_config
        return dataclasses.replace(base, max_num_seqs=base.max_num_seqs * self.num_stages)

    def hold(self, request_ids: Sequence[str], until: float) -> None:
        """Stall these requests until `until` (their KV is on its way)."""
        scheduler = self.engine.scheduler
        for rid in request_ids:
            scheduler.hold(rid)
            self.held[rid] = until
        if request_ids:
            self.hooks.wake_at(self, until)

    def _release_ready(self, now: float) -> None:
        if not self.held:
            return
        ready = [rid for rid, t in self.held.items() if t <= now]
        for rid in ready:
            del self.held[rid]
            self.engine.scheduler.release(rid)


    # ---- members forward to their leader ------------------------------------------
    def abort(self, request_id: str) -> None:
        target = self._leader_instance()
        if target is not None:
            target.abort(request_id)
        else:
            super().abort(request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        target = self._leader_instance()
        if target is not None:
            target.withdraw(request_ids)
        else:
            super().withdraw(request_ids)

    def _leader_instance(self) -> KunSimInstance | None:
        if not self.is_member or self.groups is None or self.leader is None:
            return None
        return self.groups.instances[self.leader]

    # ---- reconfiguration (SimPipelineGroups calls these) ---------------------------
    def become_stage_leader(self, plan: GroupPlan, memory: LayerMemory) -> None:
        """Run `plan`'s pipeline from now (the pipeline is empty)."""
        widest = max(end - start for start, end in plan.layer_slices)
        stage = dataclasses.replace(self.full_cost.model, num_layers=widest)
        stage_cost = CostModel(stage, self.full_cost.hardware, tp=self.tp)
        self._set_cost(stage_cost)
        self.num_stages = len(plan.members)
        self.engine.scheduler.config = self.group_config()
        self._stage_free = [0.0] * self.num_stages
        model = self.full_cost.model
        self._hop_per_token = model.hidden_size * model.dtype_bytes / (
            self.link.bandwidth * self.tp)
        self._hop_latency = self.link.latency
        self.leader = self.index
        self.runs = None
        self.lookahead = fit_chunk_cost(stage_cost) if self.use_lookahead else None

    def become_solo(self, num_blocks: int) -> None:
        """Hold every layer again, with `num_blocks` KV blocks (empty pipeline)."""
        self._set_cost(self.full_cost)
        self.num_stages = 1
        self._stage_free = [0.0]
        self._hop_per_token = self._hop_latency = 0.0
        self.leader = None
        self.runs = self.solo_runs
        self.engine.scheduler.config = self.base_config
        kv = self.engine.scheduler.kv
        if kv.num_device_blocks != num_blocks and kv.resize_device(num_blocks) is None:
            raise RuntimeError(f"instance {self.index}: KV in use does not fit "
                               f"{num_blocks} blocks")

    def _set_cost(self, cost: CostModel) -> None:
        self.engine.executor.cost_model = cost  # type: ignore[attr-defined]


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
        per_member = max((self.memory.num_layers - (end - start))
                         * self.memory.weight_bytes_per_layer
                         for start, end in plan.layer_slices)
        reload = self.link.transfer_time(per_member)
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
        reload = max((self.memory.num_layers - (end - start))
                     * self.memory.weight_bytes_per_layer for start, end in plan.layer_slices)
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

    def _involved_in_pending(self, index: int) -> bool:
        return any(index in plan.members for plan in self._pending)

    def bubble_ratio(self) -> float | None:
        """Idle share of the stages while grouped work was in a pipeline (so far)."""
        capacity = sum(i.stage_capacity for i in self.instances)
        busy = sum(i.stage_busy for i in self.instances)
        return None if capacity <= 0 else max(0.0, 1.0 - busy / capacity)
