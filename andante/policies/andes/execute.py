"""Carrying a decision out on the StepPlan: preempt, admit, then decode.

Design note. Andes runs inside vLLM's engine (§5), so a step follows vLLM v0's
prefill-first rule: the chosen waiting and swapped requests are admitted in priority
order until one does not fit (Algorithm 1's `break`); swapped ones come back with their
next decode token; if any prefill was scheduled the step runs no decodes, otherwise
every running request advances by one token, and when the block pool runs dry the
running request of lowest priority (the back of the order) is preempted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.plan import StepPlan

ModeFor = Callable[[StepPlan, Request], PreemptionMode]


def preempt(plan: StepPlan, victims: Sequence[Request], mode_for: ModeFor) -> int:
    """Preempt every victim that still can be; returns how many were."""
    count = 0
    for victim in victims:
        if plan.can_preempt(victim, PreemptionMode.RECOMPUTE):
            plan.preempt(victim, mode_for(plan, victim))
            count += 1
    return count


def _swap_in(plan: StepPlan, req: Request) -> bool:
    n = req.num_uncomputed_tokens
    if not plan.has_seq_room or plan.seq_budget < 1 or plan.token_budget < n:
        return False
    if not plan.can_swap_in(req):
        return False
    if plan.num_blocks_of(req) + plan.blocks_needed(req, n) > plan.num_free_blocks:
        return False
    plan.swap_in(req)
    plan.schedule(req, n)
    return True


def admit(plan: StepPlan, order: Sequence[Request]) -> bool:
    """Admit waiting / swap in swapped requests in order until one does not fit.

    Returns True if a prefill was scheduled (the step is then a prefill step)."""
    prefilled = False
    for req in order:
        if req.status == RequestStatus.SWAPPED:
            if not _swap_in(plan, req):
                break
            continue
        if req.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            continue
        n = req.num_uncomputed_tokens
        if not plan.has_seq_room or not plan.can_schedule(req, n):
            break
        plan.schedule(req, n)
        prefilled = True
    return prefilled


def decode(plan: StepPlan, order: Sequence[Request], mode_for: ModeFor) -> None:
    """Advance running requests in `order` (highest priority first); on block shortage
    preempt from the back of `order`, or the request itself if nobody is behind it."""
    back = len(order) - 1
    fast = plan.schedule_decode
    for req in order:
        n = req.num_uncomputed_tokens
        if n == 1 and fast(req):  # the common case: its block is there or free
            continue
        if plan.is_preempted(req) or plan.is_scheduled(req):
            continue
        if n < 1 or plan.seq_budget < 1 or plan.token_budget < n:
            continue
        while not plan.can_schedule(req, n):
            if plan.blocks_needed(req, n) <= plan.num_free_blocks:
                break  # fits in blocks yet refused: nothing more to do for it
            while back >= 0 and (order[back] is req
                                 or not plan.can_preempt(order[back], PreemptionMode.RECOMPUTE)):
                back -= 1
            target = order[back] if back >= 0 else req
            if not plan.can_preempt(target, PreemptionMode.RECOMPUTE):
                break
            plan.preempt(target, mode_for(plan, target))
            if target is req:
                break
        if plan.can_schedule(req, n):
            plan.schedule(req, n)
