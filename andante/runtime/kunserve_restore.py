"""Restoring a KunServe group on in-process engines, on the leader's thread while the
members are parked at their step boundaries (KunServe §4.4; andante.runtime.kunserve).

Design note. The full executors have been rebuilt from each member's host copy of the
weights (its `Origin`) while the group kept serving. At the boundary the rest of the KV
exchange completes (`finish_exchange`; with a member's layers lost, its pending moves
are dropped), the leader's block manager shrinks back to its own pool, running requests
past that size recomputed, newest first (`shed`; every request holding KV when a member
failed), the KV comes back from the stages into the leader's full pool (`copy_back`),
and every member serves alone again with its own executor and pool (`give_back`);
requests stay at the leader.
"""

from __future__ import annotations

from andante.core.request import Request, RequestStatus
from andante.engine.scheduler import Scheduler
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_pipeline_kv import LayerPool, copy_blocks
from andante.runtime.kunserve_parts import Group, Origin, RestoreReport, refresh_max_num_tokens
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker


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


def shed(scheduler: Scheduler, origin: Origin, everything: bool) -> int:
    """Recompute the swapped requests (the group's host KV stays in the stages), all
    running ones if `everything` (a member's layers are lost), else the newest
    running ones until the rest fit the leader's own pool. Returns how many."""
    victims = [r for r in scheduler.requests.values()
               if r.status == RequestStatus.SWAPPED
               or (everything and r.status == RequestStatus.RUNNING)]
    for req in victims:
        recompute(scheduler, req)
    count = len(victims)
    kv = scheduler.kv
    while kv.num_device_blocks - kv.num_free_device_blocks > origin.num_device_blocks:
        recompute(scheduler, scheduler.running[-1])
        count += 1
    return count


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


def recompute(scheduler: Scheduler, req: Request) -> None:
    """Drop a request's KV; it re-queues at the front, its output so far kept."""
    scheduler.release(req.request_id)
    scheduler.detach(req.request_id)
    req.preempt_by_recompute(scheduler.clock.now())
    scheduler.adopt(req)
