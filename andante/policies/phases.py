"""Building blocks shared by the vLLM-style policies (admit, decode, swap in, preempt).

Design note: these follow vLLM v0's default scheduler (vllm/core/scheduler.py,
`_schedule_default`): admit waiting requests in queue order until one does not fit;
advance running requests in order, preempting from the back of the running list
when the block pool runs dry (the request itself if nobody is behind it); bring
swapped requests back only in a step that preempted nobody.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from andante.core.request import PreemptionMode, Request
from andante.engine.plan import StepPlan


def remaining_tokens(req: Request) -> int:
    """All of a request's uncomputed tokens: a whole (re)prefill, or one decode token."""
    return req.num_uncomputed_tokens


def by_arrival(req: Request) -> float:
    return req.arrival_time


def admit_in_order(plan: StepPlan, candidates: Iterable[Request]) -> int:
    """Admit whole (re)prefills in order, stopping at the first that does not fit."""
    admitted = 0
    for req in candidates:
        if not plan.has_seq_room or not plan.can_schedule(req, req.num_uncomputed_tokens):
            break
        plan.schedule(req, req.num_uncomputed_tokens)
        admitted += 1
    return admitted


def pick_victim(plan: StepPlan, order: list[Request], protect: Request) -> Request | None:
    """The last request of `order` that is running, unscheduled and not `protect`."""
    for victim in reversed(order):
        if victim is not protect and plan.can_preempt(victim, PreemptionMode.RECOMPUTE):
            return victim
    return None


def advance_with_preemption(
    plan: StepPlan,
    order: list[Request],
    num_tokens: Callable[[Request], int],
    mode_for: Callable[[Request], PreemptionMode] | None = None,
) -> None:
    """Advance each running request of `order`; preempt from the back on block shortage.

    Stops when the sequence or token budget is spent. `mode_for` picks a victim's
    preemption mode (default: the plan's).
    """
    mode_of = mode_for or plan.preemption_mode_for
    index = 0
    while index < len(order):
        index = plan.schedule_decodes(order, index)  # the common case, kept cheap
        if index == len(order):
            return
        req = order[index]
        index += 1
        n = num_tokens(req)
        if n <= 0 or plan.is_preempted(req) or plan.is_scheduled(req):
            continue
        while not plan.can_schedule(req, n):
            if plan.seq_budget < 1 or plan.token_budget < n:
                return
            if plan.blocks_needed(req, n) <= plan.num_free_blocks:
                break  # fits in blocks yet refused: nothing more to do for it
            victim = pick_victim(plan, order, req)
            target = victim if victim is not None else req
            plan.preempt(target, mode_of(target))
            if target is req:
                break
        if plan.can_schedule(req, n):
            plan.schedule(req, n)


def swap_in_in_order(plan: StepPlan, candidates: Iterable[Request]) -> None:
    """Bring swapped requests back (and run them) while they fit."""
    for req in candidates:
        n = req.num_uncomputed_tokens
        extra = plan.blocks_needed(req, n)
        if not plan.can_swap_in(req) or plan.num_blocks_of(req) + extra > plan.num_free_blocks:
            break
        if not plan.has_seq_room:
            break
        if plan.seq_budget < 1 or plan.token_budget < n:
            break
        plan.swap_in(req)
        plan.schedule(req, n)


def preempt_for(plan: StepPlan, req: Request, victims: list[Request]) -> bool:
    """Preempt `victims` (in order) until `req`'s whole prefill fits; True if it does.

    Preempts nothing when even all of them would not make room.
    """
    n = req.num_uncomputed_tokens
    preemptable = [v for v in victims if plan.can_preempt(v, PreemptionMode.RECOMPUTE)]
    reclaimable = sum(plan.num_blocks_of(v) for v in preemptable)
    reserve = plan.blocks_needed(req, n) + int(plan.config.watermark * plan.num_total_blocks)
    if plan.seq_budget < 1 or plan.token_budget < n:
        return False
    if not plan.has_seq_room and not preemptable:
        return False
    if plan.num_free_blocks + reclaimable < reserve:
        return False
    for victim in victims:
        if plan.has_seq_room and plan.can_schedule(req, n):
            break
        if plan.can_preempt(victim, PreemptionMode.RECOMPUTE):
            plan.preempt(victim, plan.preemption_mode_for(victim))
    return plan.has_seq_room and plan.can_schedule(req, n)
