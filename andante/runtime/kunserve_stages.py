"""The torch side of KunServe's groups on in-process engines: stage pools, executors and
KV bytes (KunServe §4.1, §4.2, §4.4; the steps' order is andante.cluster.kunserve.groups',
their threads andante.runtime.kunserve's).

Design note. Forming: before the boundary, `build_pipeline` lays out the group's executor
while the members still serve (each member's layer slice with a KV pool sized by its old
pool plus the weights it drops, andante.exec.torch_pipeline). At the boundary the leader's
engine switches to it and each member gives up its weights and KV pool and passes what
still reaches it on to the leader (`switch_to_pipeline`); each member's kept layers are
copied into its stage pool in bulk, every other block move is a `KVExchange` run between
the leader's steps (`start_exchange`, `exchange_step`), bounded per step so activations
go first, the moved requests held out of the schedules until their KV has arrived.
Growing (a solo joins a formed group, the group's leader keeps leading): at the
boundary the exchange still under way completes, the leader's block manager grows to
the new member list's count (`grown_num_blocks`), andante.exec.torch_regroup re-splits
the stages and carries the group's KV to them in bulk, the joiner gives up its weights
and pool (`release_members`) and its requests' KV is queued as an exchange
(`start_grow_exchange`), as a formation's is.
Restoring: the full executors are rebuilt from each member's host copy of the weights
(its `Origin`) while the group keeps serving; at the boundary the rest of the exchange
completes (`finish_exchange`; with a member's layers lost, its pending moves are
dropped), the KV comes back from the stages into the leader's full pool (`copy_back`)
and every member serves alone again with its own executor and pool (`give_back`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping

from andante.cluster.kunserve.adopt import KVMove
from andante.cluster.kunserve.exchange import Chunk, ExchangeQueue
from andante.cluster.kunserve.lookahead import fit_chunk_cost, lookahead_planner
from andante.cluster.kunserve.plan import LayerMemory
from andante.cluster.kunserve.seam import GroupPlan
from andante.engine.scheduler import Scheduler
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_pipeline import (
    PipelineExecutor,
    StageWorkerKind,
    device_kv_bytes,
    group_num_blocks,
    layer_block_bytes,
    layer_weight_bytes,
    pipeline_executor,
)
from andante.exec.torch_pipeline_kv import LayerPool, copy_blocks
from andante.models.loader import parse_dtype
from andante.runtime.kunserve_parts import (
    Group,
    Origin,
    ReleasedExecutor,
    RestoreReport,
    refresh_max_num_tokens,
)
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker


class KVExchange:
    """The pending block moves of one group formation, copied chunk by chunk in the
    order andante.cluster.kunserve.exchange's `ExchangeQueue` hands them out.
    `sources` / `targets`: each member's pools before / after."""

    def __init__(self, moves: Iterable[KVMove], sources: Mapping[int, LayerPool],
                 targets: Mapping[int, LayerPool], chunk_blocks: int = 16) -> None:
        self._queue = ExchangeQueue(moves, chunk_blocks)
        self._sources, self._targets = dict(sources), dict(targets)
        self.bytes_exchanged = 0  # between members (over the link)
        self.bytes_local = 0  # within a member
        self.num_chunks = 0
        self.seconds = 0.0

    @property
    def done(self) -> bool:
        return self._queue.done

    def pending_ids(self) -> list[str]:
        return self._queue.pending_ids()

    def run(self, budget_bytes: int | None, is_live: Callable[[str], bool]) -> list[str]:
        """Copy chunks until `budget_bytes` are spent (None: all; at least one chunk);
        returns the requests whose KV is now complete (`ExchangeQueue.run`)."""
        started = time.perf_counter()
        complete = self._queue.run(budget_bytes, is_live, self._copy)
        if self.done:
            self._sources.clear()  # the old pools may go now
        self.seconds += time.perf_counter() - started
        return complete

    def _copy(self, chunk: Chunk) -> int:
        copied = copy_blocks(self._sources[chunk.src_member], self._targets[chunk.dst_member],
                             chunk.layers, chunk.src_blocks, chunk.dst_blocks)
        if chunk.local:
            self.bytes_local += copied
        else:
            self.bytes_exchanged += copied
        self.num_chunks += 1
        return copied


# ---- forming ------------------------------------------------------------------------
def build_pipeline(plan: GroupPlan, executors: Mapping[int, TorchExecutor],
                   pipelined: bool = True, lookahead: bool = True,
                   stage_workers: StageWorkerKind = "thread") -> PipelineExecutor:
    """The group's executor: each member's stage with the KV pool its memory holds
    once it drops the other layers (their weights are released at the boundary);
    `pipelined`: stages on their own threads, microbatches from KunServe's lookahead
    (`lookahead`; no floor on a microbatch's tokens: the paper's keeps a GPU busy, while
    on a CPU a decode batch cut in two is what lets the stages overlap) or cut by rows;
    `stage_workers`: threads, or processes (started now, while the members serve)."""
    lead = executors[plan.leader]
    kv_bytes = [device_kv_bytes(executors[m].kv.num_device_blocks, lead.model, lead.options)
                for m in plan.members]
    planner = lookahead_planner(fit_chunk_cost(lead.cost_model)) \
        if pipelined and lookahead else None
    # the leader's resolved thread count: the stages' share of it must not depend on
    # the count the forming thread has now (1 after a small step: TorchExecutor._set_threads)
    options = dataclasses.replace(lead.options, num_threads=lead.num_threads)
    pipeline = pipeline_executor(lead.model, options, plan.layer_slices, kv_bytes,
                                 lead.cost_model, lead.max_model_len,
                                 lead.kv.num_host_blocks, pipelined, planner, lead.inputs,
                                 stage_workers)
    if pipelined:
        try:
            pipeline.start_workers()
        except BaseException:
            pipeline.close()  # the stage processes that did start
            raise
    return pipeline


def switch_to_pipeline(plan: GroupPlan, workers: Mapping[int, InstanceWorker],
                       instances: Mapping[int, LocalInstance], pipeline: PipelineExecutor
                       ) -> None:
    """The leader's engine runs the group's executor; each member's gives up its
    weights and KV pool and its worker redirects to the leader."""
    workers[plan.leader].engine.executor = pipeline
    release_members(plan.leader, plan.members[1:], workers, instances)


def release_members(leader_index: int, members: Iterable[int],
                    workers: Mapping[int, InstanceWorker],
                    instances: Mapping[int, LocalInstance]) -> None:
    """Each of `members` gives up its weights and KV pool (they serve as its stage of
    the group led by `leader_index` now) and its worker redirects to the leader."""
    leader = workers[leader_index]
    for member in members:
        worker = workers[member]
        engine = worker.engine
        engine.executor = ReleasedExecutor(member, leader_index, engine.executor.cost_model)
        engine.scheduler.kv.resize_device(0)  # its memory is its stage's now
        refresh_max_num_tokens(engine.scheduler)
        worker.redirect = leader
        instances[member].group_leader = leader_index


def start_exchange(plan: GroupPlan, executors: Mapping[int, TorchExecutor],
                   pipeline: PipelineExecutor, moves: list[KVMove], leader: Scheduler,
                   chunk_blocks: int) -> tuple[KVExchange | None, int]:
    """Copy each member's kept layers into its stage pool now, in bulk (the leader's
    requests keep their block ids, and a move to the same block of the same member
    is not listed); queue every other move (§4.2) and hold its requests. Returns the
    exchange (None: nothing to move) and the bytes copied in bulk."""
    copied = 0
    for member, stage in zip(plan.members, pipeline.stages, strict=True):
        old = executors[member].kv
        start, end = stage.layers_range
        kept = stage.kv.device[:, :, :old.num_device_blocks]
        kept.copy_(old.device[start:end])
        copied += kept.numel() * kept.element_size()
    if not moves:
        return None, copied
    sources = {m: LayerPool(e.kv.device) for m, e in executors.items()}
    targets = {m: LayerPool(stage.kv.device, stage.layers_range[0])
               for m, stage in zip(plan.members, pipeline.stages, strict=True)}
    exchange = KVExchange(moves, sources, targets, chunk_blocks)
    for rid in exchange.pending_ids():
        leader.hold(rid)
    return exchange, copied


# ---- growing (a solo joins a formed group) ---------------------------------------------
def grown_num_blocks(plan: GroupPlan, origins: Mapping[int, Origin]) -> int:
    """The block count of the group `plan` once every member keeps its slice and lends
    the pool it had alone (its `Origin`) plus the weights it drops."""
    lead = origins[plan.leader]
    kv_bytes = [device_kv_bytes(origins[m].num_device_blocks, lead.model, lead.options)
                for m in plan.members]
    return group_num_blocks(lead.model, lead.options, plan.layer_slices, kv_bytes)


def start_grow_exchange(plan: GroupPlan, joiners: Mapping[int, TorchExecutor],
                        pipeline: PipelineExecutor, moves: list[KVMove], leader: Scheduler,
                        chunk_blocks: int) -> KVExchange | None:
    """After `regroup` carried the group's own KV to its new stages: queue the moves
    of the joiners' requests from the joiners' pools to the stages that hold their
    layers now (§4.2, chunked between the leader's steps) and hold those requests."""
    moves = [m for m in moves if m.src_member in joiners]
    if not moves:
        return None
    sources = {m: LayerPool(e.kv.device) for m, e in joiners.items()}
    targets = {m: LayerPool(stage.kv.device, stage.layers_range[0])
               for m, stage in zip(plan.members, pipeline.stages, strict=True)}
    exchange = KVExchange(moves, sources, targets, chunk_blocks)
    for rid in exchange.pending_ids():
        leader.hold(rid)
    return exchange


def exchange_step(group: Group, leader: InstanceWorker, bytes_per_step: int,
                  ran_batch: bool) -> bool:
    """A boundary task of the leader: copy the next chunks, release the requests
    whose KV is complete; False once the exchange is over."""
    exchange = group.exchange
    if exchange is None:
        return False
    scheduler = leader.engine.scheduler
    budget = bytes_per_step if ran_batch else None
    for rid in exchange.run(budget, scheduler.requests.__contains__):
        scheduler.release(rid)
    group.report.kv_bytes_exchanged = exchange.bytes_exchanged
    if not exchange.done:
        return True
    group.report.kv_bytes_local += exchange.bytes_local
    group.report.exchange_seconds = time.perf_counter() - group.formed_at
    group.exchange = None
    return False


# ---- restoring ----------------------------------------------------------------------
def finish_exchange(group: Group, scheduler: Scheduler, lost: bool) -> None:
    """Run the rest of the group's KV exchange (dropped if a member's layers are `lost`)
    and release every request it held."""
    exchange, group.exchange = group.exchange, None
    if exchange is None:
        return
    if not lost:
        exchange.run(None, scheduler.requests.__contains__)
        group.report.kv_bytes_exchanged = exchange.bytes_exchanged
        group.report.kv_bytes_local += exchange.bytes_local
    for rid in exchange.pending_ids() if lost else list(scheduler.requests):
        scheduler.release(rid)


def copy_back(group: Group, scheduler: Scheduler, full: TorchExecutor,
              report: RestoreReport) -> None:
    """Shrink the leader's blocks to its own pool and copy every running request's
    KV from the stages into it (§4.4: the KV moves back)."""
    old_tables = {r.request_id: list(scheduler.kv.block_table(r.request_id))
                  for r in scheduler.running}
    moved = scheduler.kv.resize_device(group.origins[group.plan.leader].num_device_blocks)
    assert moved is not None, "the running requests were shed to fit"
    src_blocks = [b for table in old_tables.values() for b in table]
    dst_blocks = [b for rid in old_tables for b in scheduler.kv.block_table(rid)]
    target = LayerPool(full.kv.device)
    for member, stage in zip(group.plan.members, group.executor.stages, strict=True):
        copied = copy_blocks(LayerPool(stage.kv.device, stage.layers_range[0]), target,
                             stage.layers_range, src_blocks, dst_blocks)
        if member == group.plan.leader:
            report.kv_bytes_local += copied
        else:
            report.kv_bytes_back += copied


def give_back(worker: InstanceWorker, instance: LocalInstance, executor: TorchExecutor,
              origin: Origin) -> None:
    """A member serves alone again: its own executor and KV pool, no redirect."""
    worker.engine.executor = executor
    worker.engine.scheduler.kv.resize_device(origin.num_device_blocks)
    refresh_max_num_tokens(worker.engine.scheduler)
    worker.redirect = None
    instance.group_leader = None


def layer_memory(executor: TorchExecutor) -> LayerMemory:
    """One unsplit instance's memory in the drop plan's units (andante.cluster.kunserve.
    plan), from its executor: a layer's weights, a layer's KV block, the KV pool."""
    model, options = executor.model, executor.options
    dtype = parse_dtype(options.dtype)
    weight = layer_weight_bytes(model.weights.layers[0]) * dtype.itemsize // max(
        1, model.weights.dtype.itemsize)
    return LayerMemory(
        num_layers=model.config.num_layers, weight_bytes_per_layer=weight,
        kv_block_bytes_per_layer=layer_block_bytes(model, dtype, options.block_size),
        kv_region_bytes=device_kv_bytes(executor.kv.num_device_blocks, model, options))
