"""The loops vLLM-style policies share: admit, advance with preemption from the back,
swap in, and preempt for an arrival; the orders and checks of chunked steps.

Design note: vLLM's schedulers. `advance_with_preemption` is the running loop of v1
(vllm/v1/core/sched/scheduler.py, `schedule`) and v0 (`_schedule_running`): advance
running requests in order; when one's blocks cannot be allocated, preempt from the back
(the request itself if nobody is behind it). `admit_in_order` is the waiting loop: in
queue order until one does not fit (head-of-line). `swap_in_in_order` is v0's
`_schedule_swapped`; `preempt_for` its priority mode (`_schedule_priority_preemption`).
A request advances by its remaining tokens (`remaining_tokens`: prefill-first) or by
those capped by the step's token budget (`budgeted`: v1's chunked prefill).
`admit_and_swap_in` admits and swaps in along one priority order (Andes' decisions
interleave waiting and swapped requests); `decodes_first` is Sarathi-Serve's order of a
chunked step (the streams before the prompts still prefilling).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import groupby

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.plan import StepPlan

TokenCount = Callable[[Request], int]  # tokens a request advances this step (0: none)


def remaining_tokens(req: Request) -> int:
    """All of a request's uncomputed tokens: a whole (re)prefill, or one decode token."""
    return req.num_uncomputed_tokens


def budgeted(plan: StepPlan) -> TokenCount:
    """A request's uncomputed tokens capped by what is left of the step's token budget."""

    def num_tokens(req: Request) -> int:
        return min(req.num_uncomputed_tokens, plan.token_budget)

    return num_tokens


def by_arrival(req: Request) -> float:
    return req.arrival_time


def admit_in_order(
    plan: StepPlan,
    candidates: Iterable[Request],
    num_tokens: TokenCount = remaining_tokens,
    accept: Callable[[Request, int], bool] | None = None,
) -> int:
    """Admit requests in order, stopping at the first that does not fit (or that the
    policy's own `accept(req, num_tokens)` refuses); returns how many it admitted."""
    admitted = 0
    for req in candidates:
        n = num_tokens(req)
        if n < 1 or not plan.has_seq_room or not plan.can_schedule(req, n):
            break
        if accept is not None and not accept(req, n):
            break
        plan.schedule(req, n)
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
    num_tokens: TokenCount,
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


def swap_in_in_order(
    plan: StepPlan, candidates: Iterable[Request], num_tokens: TokenCount = remaining_tokens
) -> None:
    """Bring swapped requests back (and run them) while they fit."""
    for req in candidates:
        n = num_tokens(req)
        if n < 1 or not plan.has_seq_room or plan.seq_budget < 1 or plan.token_budget < n:
            break
        if not plan.can_swap_in(req, n):
            break
        plan.swap_in(req)
        plan.schedule(req, n)


def prefill_first_step(
    plan: StepPlan, admit: Callable[[StepPlan], object], mixed: bool = False
) -> None:
    """vLLM v0's step: admit new prefills (never while requests are swapped out); a step
    that admitted nothing advances the running requests, preempting from the back, and
    swaps requests back in if it preempted nobody. `mixed`: advance them in any case."""
    if not plan.swapped:
        admit(plan)
    if not plan.scheduled or mixed:
        advance_with_preemption(plan, plan.running, remaining_tokens)
        if not plan.preemptions:
            swap_in_in_order(plan, plan.swapped)


def preempt_for(plan: StepPlan, req: Request, victims: list[Request]) -> bool:
    """Preempt `victims` (in order) until `req`'s whole prefill fits; True if it does.

    Preempts nothing when even all of them would not make room.
    """
    n = req.num_uncomputed_tokens
    preemptable = [v for v in victims if plan.can_preempt(v, PreemptionMode.RECOMPUTE)]
    reclaimable = sum(plan.num_blocks_of(v) for v in preemptable)
    if plan.seq_budget < 1 or plan.token_budget < n:
        return False
    if not plan.has_seq_room and not preemptable:
        return False
    if reclaimable < plan.blocks_short(req, n):
        return False
    for victim in victims:
        if plan.has_seq_room and plan.can_schedule(req, n):
            break
        if plan.can_preempt(victim, PreemptionMode.RECOMPUTE):
            plan.preempt(victim, plan.preemption_mode_for(victim))
    return plan.has_seq_room and plan.can_schedule(req, n)


def _is_swapped(req: Request) -> bool:
    return req.status == RequestStatus.SWAPPED


def admit_and_swap_in(plan: StepPlan, order: Sequence[Request],
                      num_tokens: TokenCount = remaining_tokens) -> bool:
    """Admit waiting and swap in swapped requests in `order` until one does not fit;
    True if a prefill was scheduled (the step is then a prefill step)."""
    prefilled = False
    for swapped, group in groupby(order, key=_is_swapped):
        run = list(group)
        if swapped:
            before = len(plan.swap_ins)
            swap_in_in_order(plan, run, num_tokens)
            done = len(plan.swap_ins) - before
        else:
            done = admit_in_order(plan, run, num_tokens)
            prefilled = prefilled or done > 0
        if done < len(run):
            break
    return prefilled


def decodes_first(order: list[Request]) -> list[Request]:
    """`order` with the requests still prefilling (in chunks) moved to the end, so that
    no stream waits for a chunk's share of the token budget."""
    decoding: list[Request] = []
    prefilling: list[Request] = []
    for req in order:  # (one pass: each request's token count is read once)
        (prefilling if req.num_uncomputed_tokens > 1 else decoding).append(req)
    return decoding + prefilling if prefilling else order


def schedules_prompt_chunk(plan: StepPlan) -> bool:
    """Does the step schedule a prompt chunk (more than one token for a request)?"""
    return max(plan.num_scheduled_tokens, default=0) > 1


def empties_queue(plan: StepPlan) -> bool:
    """Does the step schedule every waiting and swapped request (none is left queued)?"""
    if not (plan.waiting or plan.swapped):
        return True
    scheduled = plan.is_scheduled
    return all(map(scheduled, plan.waiting)) and all(map(scheduled, plan.swapped))


def running_fill_budget(plan: StepPlan) -> bool:
    """Do the running requests' remaining tokens fill the step's token budget? (Stops
    counting once they do: a long prompt's chunk usually does at once.)"""
    left = plan.token_budget
    for req in plan.running:
        left -= req.num_uncomputed_tokens
        if left <= 0:
            return True
    return left <= 0
