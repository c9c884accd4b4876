"""Forming a KunServe group on in-process engines, on the leader's thread while the members
are parked at their step boundaries (KunServe §4.1, §4.2; andante.runtime.kunserve).

Design note. Before the boundary, `build_pipeline` lays out the group's executor while the
members still serve: each member's layer slice with a KV pool sized by its old pool plus
the weights it drops (andante.exec.torch_pipeline). At the boundary:
- every member's requests move into the leader's scheduler and output adapter
  (`adopt_requests`, andante.cluster.kunserve.adopt: waiting ones re-queued, running ones
  adopted with a new block table);
- each member's kept layers are copied into its stage pool in bulk; every other block
  move is a `KVExchange` (§4.2) that `exchange_step` runs between the leader's steps,
  bounded per step (activations first), the adopted requests held out of the schedules
  until their KV has arrived (`start_exchange`);
- the leader's engine switches to the `PipelineExecutor`, the members' block managers
  shrink to none (their memory is their stage now), their executors (their weights) are
  released and their workers pass what still reaches them on to the leader
  (`switch_to_pipeline`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from andante.cluster.kunserve.adopt import KVMove, adopt_group, whole_model
from andante.cluster.kunserve.seam import GroupPlan
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_pipeline import PipelineExecutor, device_kv_bytes, pipeline_executor
from andante.exec.torch_pipeline_kv import KVExchange, LayerPool
from andante.runtime.kunserve_parts import (
    FormReport,
    Group,
    ReleasedExecutor,
    refresh_max_num_tokens,
)
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker


def build_pipeline(plan: GroupPlan, executors: Mapping[int, TorchExecutor]
                   ) -> PipelineExecutor:
    """The group's executor: each member's stage with the KV pool its memory holds
    once it drops the other layers (their weights are released at the boundary)."""
    lead = executors[plan.leader]
    kv_bytes = [device_kv_bytes(executors[m].kv.num_device_blocks, lead.model, lead.options)
                for m in plan.members]
    return pipeline_executor(lead.model, lead.options, plan.layer_slices, kv_bytes,
                             lead.cost_model, lead.max_model_len, lead.kv.num_host_blocks)


def adopt_requests(plan: GroupPlan, workers: Mapping[int, InstanceWorker],
                   report: FormReport) -> list[KVMove]:
    """Every member's requests into the leader's scheduler (and its output
    adapter); returns the block moves of the adopted running requests."""
    leader = workers[plan.leader]
    held = {m: list(w.engine.scheduler.requests.values()) for m, w in workers.items()
            if m != plan.leader}
    adoption = adopt_group(
        [(w.engine.scheduler, whole_model(m, plan.num_layers)) for m, w in workers.items()],
        leader.engine.scheduler, plan)
    for member, reqs in held.items():
        source = workers[member]
        for req in reqs:
            source.adapter.discard(req.request_id)
            leader.adapter.register(req)
    report.num_adopted = len(adoption.adopted)
    report.num_requeued = len(adoption.requeued)
    report.num_recomputed = len(adoption.recomputed)
    return adoption.moves


def start_exchange(plan: GroupPlan, executors: Mapping[int, TorchExecutor],
                   pipeline: PipelineExecutor, report: FormReport, moves: list[KVMove],
                   leader: InstanceWorker, chunk_blocks: int) -> KVExchange | None:
    """Copy each member's kept layers into its stage pool now, in bulk (the leader's
    requests keep their block ids, and a move to the same block of the same member
    is not listed); queue every other move (§4.2) and hold its requests."""
    for member, stage in zip(plan.members, pipeline.stages, strict=True):
        old = executors[member].kv
        start, end = stage.layers_range
        kept = stage.kv.device[:, :, :old.num_device_blocks]
        kept.copy_(old.device[start:end])
        report.kv_bytes_local += kept.numel() * kept.element_size()
    if not moves:
        return None
    sources = {m: LayerPool(e.kv.device) for m, e in executors.items()}
    targets = {m: LayerPool(stage.kv.device, stage.layers_range[0])
               for m, stage in zip(plan.members, pipeline.stages, strict=True)}
    exchange = KVExchange(moves, sources, targets, chunk_blocks)
    scheduler = leader.engine.scheduler
    for rid in exchange.pending_ids():
        scheduler.hold(rid)
    return exchange


def switch_to_pipeline(plan: GroupPlan, workers: Mapping[int, InstanceWorker],
                       instances: Mapping[int, LocalInstance], pipeline: PipelineExecutor
                       ) -> None:
    """The leader's engine runs the group's executor; each member's gives up its
    weights and KV pool and its worker redirects to the leader."""
    leader = workers[plan.leader]
    leader.engine.executor = pipeline
    for member in plan.members[1:]:
        worker = workers[member]
        engine = worker.engine
        engine.executor = ReleasedExecutor(member, plan.leader, engine.executor.cost_model)
        engine.scheduler.kv.resize_device(0)  # its memory is its stage's now
        refresh_max_num_tokens(engine.scheduler)
        worker.redirect = leader
        instances[member].group_leader = plan.leader


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
