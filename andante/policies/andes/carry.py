"""Carrying an `andes` decision out through the shared step loops (`phases.py`).

Design note (Andes §5: Andes is implemented in vLLM v0, whose steps are prefill-first).
Without chunked prefill the chosen victims are preempted, the chosen waiting and
swapped requests admitted in priority order until one does not fit (Algorithm 1's
`break`), and only if no prefill was scheduled every running request advances by one
token, the lowest-priority one preempted when blocks run dry. With chunked prefill
(vLLM v1 / Sarathi-Serve steps) the running requests advance first, the admissions then
take prefill chunks from what is left of the step's token budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.plan import StepPlan
from andante.policies.phases import (
    TokenCount,
    admit_in_order,
    advance_with_preemption,
    budgeted,
    remaining_tokens,
    swap_in_in_order,
)


@dataclass(slots=True)
class Decision:
    admits: list[Request] = field(default_factory=list)  # in the order to try
    victims: list[Request] = field(default_factory=list)  # preempt now
    decode_order: list[Request] = field(default_factory=list)  # highest priority first


def carry_out(plan: StepPlan, decision: Decision, chunked: bool,
              mode_for: Callable[[Request], PreemptionMode]) -> None:
    """Preempt `decision`'s victims, then advance and admit as the module note says."""
    for victim in decision.victims:
        if plan.can_preempt(victim, PreemptionMode.RECOMPUTE):
            plan.preempt(victim, mode_for(victim))
    if not chunked:
        if not admit(plan, decision.admits):
            advance_with_preemption(plan, decision.decode_order, remaining_tokens,
                                    mode_for)
        return
    num_tokens = budgeted(plan)  # running requests first, then the admissions
    preempted = len(plan.preemptions)
    advance_with_preemption(plan, decodes_first(decision.decode_order), num_tokens,
                            mode_for)
    if len(plan.preemptions) == preempted:
        admit(plan, decision.admits, num_tokens)


def schedules_prompt_chunk(plan: StepPlan) -> bool:
    """Does the step schedule a prompt chunk (more than one token for a request)?"""
    return max(plan.num_scheduled_tokens, default=0) > 1


def decodes_first(order: list[Request]) -> list[Request]:
    """`order` with the requests still prefilling (in chunks) moved to the end, so that
    no stream waits for a chunk's share of the token budget."""
    decoding: list[Request] = []
    prefilling: list[Request] = []
    for req in order:  # (one pass: each request's token count is read once)
        (prefilling if req.num_uncomputed_tokens > 1 else decoding).append(req)
    return decoding + prefilling if prefilling else order


def empties_queue(plan: StepPlan) -> bool:
    """Does the step schedule every waiting and swapped request (none is left queued)?"""
    if not (plan.waiting or plan.swapped):
        return True
    scheduled = plan.is_scheduled
    return all(map(scheduled, plan.waiting)) and all(map(scheduled, plan.swapped))


def _is_swapped(req: Request) -> bool:
    return req.status == RequestStatus.SWAPPED


def admit(plan: StepPlan, order: Sequence[Request],
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
