"""An instance with work and no progress: detected at the step, resolved with a reason.

Design note (DESIGN.md rule 7: a request that can never fit is refused, not queued
forever). A scheduler can hold requests it can never schedule: a prompt that fits the
KV cache but not above the admission watermark, a swapped request that cannot come back,
or requests that each fit alone and block each other under a policy's order. Its step
is then empty although it has work and nothing of it is in flight; nothing inside the
instance will change that, so a server would spin on it forever and a simulation would
end with "unfinished" requests and no word. The engine confirms the stall by scheduling
once more (a fresh prefix lookup or a policy's own state may admit something now), then
refuses one request with a reason: the one that asks the most KV of those holding none
on the device (the least likely ever to fit; the latest arrival among equals), and
steps again, until something runs or no work is left. Each refusal is counted
(`Engine.num_stalls`) and its reason is the request's rejection reason, so a run's
result says what happened.
"""

from __future__ import annotations

from andante.core.request import Request, RequestStatus
from andante.engine.scheduler import Scheduler


def is_stalled(scheduler: Scheduler) -> bool:
    """Work, nothing in flight: an empty step now means no progress at all."""
    return scheduler.has_unfinished and not scheduler.has_in_flight


def stall_victim(scheduler: Scheduler) -> Request | None:
    """The request to refuse: the largest of those holding no device KV (waiting,
    preempted or swapped), the latest arrival among equals; else the largest running."""
    idle = [r for r in scheduler.requests.values() if r.status != RequestStatus.RUNNING]
    pool = idle or list(scheduler.requests.values())
    if not pool:
        return None
    return max(pool, key=lambda r: (r.num_tokens, r.arrival_time))


def stall_reason(scheduler: Scheduler, req: Request) -> str:
    kv = scheduler.kv
    need = kv.num_blocks_for(req.num_tokens + 1)
    return (f"refused: the instance stalled (work, yet it could schedule nothing) with "
            f"{len(scheduler.requests)} requests; this one needs {need} KV blocks for "
            f"{req.num_tokens} tokens, {kv.num_free_device_blocks} of "
            f"{kv.num_device_blocks} free, {kv.watermark_blocks} kept free for admissions")


def refuse_one(scheduler: Scheduler) -> Request | None:
    """Refuse the stall's victim (its KV freed); returns it, or None if no work."""
    victim = stall_victim(scheduler)
    if victim is None:
        return None
    reason = stall_reason(scheduler, victim)
    scheduler.abort_request(victim.request_id, RequestStatus.FINISHED_REJECTED)
    victim.timeline.rejection_reason = reason
    return victim
