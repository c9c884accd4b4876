"""A simulated instance that can lead or join a KunServe pipeline group: the group's
time on the simulated clock (KunServe §4.1-§4.3).

Design note (KunServe §4.1-§4.3 on andante.sim). Every instance is a `KunSimInstance`, a
pipeline instance of one stage while ungrouped. When its cluster's pipeline groups
(andante.sim.kunserve, over andante.cluster.kunserve.groups) make it a group's leader
(`become_stage_leader`), it runs `len(members)` pipeline stages (andante.sim.pipeline):
each stage costs the step of its slice of layers (the largest slice, from the cost
model), and hidden states cross an inter-instance link (`andante.perf.links`) between
stages. A grouped step holds a cycle's worth of work (`group_config`) and is cut into
microbatches by the real engine's decision code: with lookahead (§4.3) andante.cluster.
kunserve.lookahead's `step_microbatches` (balanced by eq. (1)), without it andante.exec.
microbatch's `by_rows`; each microbatch costs, on every stage, the stage cost model's time
for its sub-batch, and the microbatches flow through the stages one after another. Each
completes on its own (andante.sim.pipeline): the requests whose last tokens it carries
get them when it leaves the last stage, and the next step, formed once stage 0 is free
from the requests not in flight, fills the free slots (lookahead's `slot_config`, its
sequence budget scaled by `seq_scale`, the group's KV blocks per member over one
undropped instance's); with lookahead and a queue longer than the slot takes, its prefill
tokens are those whose stage time matches the dearest of the last `num_stages`
microbatches (`balanced_token_budget`, timed by the stage cost model). Fill,
drain and unbalanced microbatches leave bubbles, which the groups' `bubble_ratio`
reports from this instance's stage-seconds. While a KV exchange (§4.2) occupies the link,
the requests whose KV is on its way are held (`hold`); coordinated (the paper's design),
an activation waits at most for the chunk on the wire (a chunk
lasts about one stage step), uncoordinated it queues behind the whole exchange. A member
forwards aborts and withdrawals to its leader; at each step boundary the instance tells
its groups, which apply the formations and restores that waited for it.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol, cast

from andante.cluster.kunserve.lookahead import (
    ChunkCostModel,
    balanced_slot_config,
    fit_chunk_cost,
    free_slots,
    group_config,
    lookahead_planner,
    queued_work,
    slot_config,
    stage_cost_model,
)
from andante.cluster.kunserve.seam import GroupPlan
from andante.engine.config import SchedulerConfig
from andante.engine.engine import Engine, StepOutput
from andante.exec.base import DecodeRunExecutor
from andante.exec.batch import StepBatch, StepResult
from andante.exec.microbatch import MicrobatchPlanner, by_rows, completion_rows, sub_batch
from andante.exec.sim_executor import SimExecutor
from andante.perf.cost_model import CostModel
from andante.perf.links import LinkSpec
from andante.sim.pipeline import Microbatch, PipelineSimInstance


class GroupBoundaries(Protocol):
    """What an instance asks of its cluster's pipeline groups (`SimPipelineGroups`)."""

    instances: list[KunSimInstance]

    def at_boundary(self, inst: KunSimInstance) -> None:
        """`inst` has no batch in flight: apply what waited for it."""

    def between_steps(self, inst: KunSimInstance) -> None:
        """A step of `inst` finished with more in its pipeline."""


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
        self.groups: GroupBoundaries | None = None
        self.use_lookahead = False  # balance microbatches (§4.3) while grouped
        self.planner: MicrobatchPlanner = by_rows  # cuts a grouped step
        self.base_config = self.engine.scheduler.config
        self.stage_busy = 0.0  # stage-seconds computed while grouped
        self.stage_capacity = 0.0  # stage-seconds while the grouped pipeline held work
        self._open_since: float | None = None
        self._slots = 1  # microbatches the step being formed may hold
        self.solo_blocks = self.engine.scheduler.kv.num_device_blocks  # undropped pool
        self.scale_seqs = True  # a group's sequence cap follows its KV (group_config)
        self.chunk_model: ChunkCostModel | None = None  # eq. (1), while grouped with lookahead
        self._recent: deque[float] = deque(maxlen=1)  # stage seconds of the last microbatches

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
        return self.num_in_flight >= self.num_stages or now + 1e-9 < self._stage_free[0]

    def begin_step(self, now: float) -> float | None:
        if self.groups is not None and not self._pipeline:
            self.groups.at_boundary(self)
        if self.draining or self.down or self.is_member:
            return None
        self._release_ready(now)
        was_empty = not self._pipeline
        busy_before = self.stats.busy_time
        if self.grouped:  # the step fills the free slots (lookahead's slot_config)
            self._slots = free_slots(self.num_stages, self.num_in_flight)
            config = slot_config(self.base_config, self.num_stages, self.num_in_flight,
                                 self.seq_scale)
            self.engine.scheduler.config = self._balanced(config)
        done = super().begin_step(now)
        if self.grouped:
            self.engine.scheduler.config = self.group_config()
        if done is not None and self.grouped:
            self.stage_busy += (self.stats.busy_time - busy_before) * self.num_stages
            if was_empty:
                self._open_since = now
        return done

    def _balanced(self, config: SchedulerConfig) -> SchedulerConfig:
        """With lookahead, microbatches in flight and more prefill queued than the slot's
        budget takes (a burst: §4.3 looks ahead only where requests queue; with a short
        queue, holding prompt tokens back would only add to their TTFT): the step's
        token budget whose cost on a stage matches the dearest of the last `num_stages`
        microbatches (lookahead's `balanced_token_budget`, timed by the stage's cost
        model: the simulator's profile); else `config` as it is."""
        scheduler = self.engine.scheduler
        if self.chunk_model is None or not self.num_in_flight or not self._recent:
            return config
        in_flight = {r.request_id for c in self._pipeline for r in c.batch.requests}
        decodes, queued = queued_work(scheduler.running, scheduler.waiting, in_flight)
        cost = cast(SimExecutor, self.engine.executor).cost_model
        return balanced_slot_config(config, cost, decodes, queued, self._recent)

    def microbatches(self, batch: StepBatch, result: StepResult) -> list[Microbatch]:
        """A grouped step's microbatches (`planner` over the free slots, the real
        engine's decision code), each timed on one stage by the stage cost model and
        completing the rows whose last piece it holds (andante.sim.pipeline's
        `Microbatch`); the step's swaps go before the first."""
        if not self.grouped:
            return super().microbatches(batch, result)
        executor = cast(SimExecutor, self.engine.executor)
        plan = self.planner(batch, self._slots)
        micro = []
        for pieces, rows in zip(plan, completion_rows(batch, plan), strict=True):
            sub, _ = sub_batch(batch, pieces)
            micro.append(Microbatch(executor.forward_time(sub), sub.num_tokens,
                                    rows.sampling, rows.ordered))
        if micro:
            extra = max(0.0, result.duration - executor.forward_time(batch))
            micro[0] = dataclasses.replace(micro[0], seconds=micro[0].seconds + extra)
        self._recent.extend(m.seconds for m in micro)
        return micro

    def finish_step(self) -> tuple[StepBatch, StepOutput]:
        if self.decode_run is not None:
            self.last_step_end = self.engine.clock.now()
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
        elif self.groups is not None and self.grouped:
            self.groups.between_steps(self)
        return out

    def _hop_done(self, start: float, hop: float) -> float:
        if start >= self.link_busy_until:
            return start + hop
        if self.coordinated:  # waits for the KV chunk on the wire, then goes first
            return start + min(self.chunk_seconds, self.link_busy_until - start) + hop
        return self.link_busy_until + hop  # queued behind the whole exchange

    def group_config(self) -> SchedulerConfig:
        """The leader's budgets while grouped (andante.cluster.kunserve.lookahead)."""
        return group_config(self.base_config, self.num_stages, self.seq_scale)

    @property
    def seq_scale(self) -> float:
        """The group's KV blocks per stage over one undropped instance's: how much larger
        a batch each microbatch slot holds (lookahead's `group_config`)."""
        if not self.grouped or not self.scale_seqs:
            return 1.0
        blocks = self.engine.scheduler.kv.num_device_blocks
        return max(1.0, blocks / (self.num_stages * self.solo_blocks))

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
    def become_stage_leader(self, plan: GroupPlan) -> None:
        """Run `plan`'s pipeline from now (the pipeline is empty)."""
        stage_cost = stage_cost_model(self.full_cost, plan.layer_slices)
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
        self.chunk_model = fit_chunk_cost(stage_cost) if self.use_lookahead else None
        self.planner = by_rows if self.chunk_model is None else lookahead_planner(
            self.chunk_model, self.base_config.block_size)
        self._recent = deque(maxlen=self.num_stages)

    def become_solo(self, num_blocks: int) -> None:
        """Hold every layer again, with `num_blocks` KV blocks (empty pipeline)."""
        self._set_cost(self.full_cost)
        self.num_stages = 1
        self._stage_free = [0.0]
        self._hop_per_token = self._hop_latency = 0.0
        self.leader = None
        self.chunk_model = None
        self.runs = self.solo_runs
        self.engine.scheduler.config = self.base_config
        kv = self.engine.scheduler.kv
        if kv.num_device_blocks != num_blocks and kv.resize_device(num_blocks) is None:
            raise RuntimeError(f"instance {self.index}: KV in use does not fit "
                               f"{num_blocks} blocks")

    def _set_cost(self, cost: CostModel) -> None:
        self.engine.executor.cost_model = cost  # type: ignore[attr-defined]
