"""Decode runs across finishes: the all-decode batch that follows a finish when nothing
waits (simulation fast path, andante.sim.decode_run).

Design note: a decode run ends at the step that finishes a request, and none follows a
step that completed prefills; the next step is then decided by the policy. With nothing
waiting or swapped and every running request decoding, a policy that declares
`decode_budget` > 0 (andante.engine.fast_path) advances every running request by one
token, in the running list's order (or in its `decode_order`, FastServe's job order),
whenever their blocks fit and they number at most that budget (vLLM's v1 and v0 loops,
Sarathi's, the static orders that keep the admission order, the static batch, both
Ascendra pools: their running loop, with no one to admit; FastServe when its last
decision found room on the device for every job to its last token). That batch is the
one a step would schedule, and so is every step's after it until an arrival or a finish,
so a decode run may start at once from it instead of after a scheduled step (the length
limits and `fit_blocks` bound it as any run; the policy's `on_decode_run` replays its
steps). A test checks that timelines are identical with and without.
"""

from __future__ import annotations

from andante.core.request import RequestStatus
from andante.engine.fast_path import SimFastPath
from andante.engine.scheduler import Scheduler
from andante.exec.batch import StepBatch

_RUNNING = RequestStatus.RUNNING


def batch_after_finish(scheduler: Scheduler, fast: SimFastPath) -> StepBatch | None:
    """The all-decode batch of every running request that the scheduler's policy
    `fast` certainly schedules next (None: a step must decide)."""
    running = scheduler.running
    budget = fast.decode_budget
    if budget <= 0 or not running:
        return None
    if (scheduler.waiting or scheduler.swapped or scheduler.has_in_flight
            or scheduler.has_evictions):
        return None
    if scheduler.added_since_schedule or scheduler.last_step_preempted:
        return None
    if len(running) > min(budget, scheduler.config.max_num_seqs):
        return None
    if any(r.status != _RUNNING or r.num_uncomputed_tokens != 1 for r in running):
        return None
    batch_order = fast.decode_order(running, scheduler.kv.num_free_device_blocks)
    if batch_order is None or len(batch_order) != len(running):
        return None
    block_table = scheduler.kv.block_table
    return StepBatch.decodes(list(batch_order),
                             [block_table(req.request_id) for req in batch_order])
