"""Which jobs run this step and which deserve a place on the device.

Design note: FastServe §4.1 (Algorithm 1, lines 23-25: the batch is the highest-
priority *ready* jobs, up to the batch size) and §4.2 (the device keeps the KV of the
jobs likely to run next). Walking the job order, highest priority first:
- a job gets a *place* if its KV after its next iteration fits beside the places given
  before it. Jobs that hold KV may not use the reserve of idle slots kept for arriving
  jobs (§4.2 "handling a burst"); jobs without KV may, unless a job ahead of them in the
  order was denied a place (the reserve does not let a job overtake a better one);
- a job without KV is only started while the device and host tiers together can hold
  its KV (a bound on started jobs, which MLFQ multiplies, §4.2 and Fig. 8: beyond it
  every admission would cost a recompute);
- a placed job is in the batch if it is ready (its KV is on the device, or it has none
  yet; a swapped one only where the step may wait for its swap-in) and fits the step's
  token and sequence budgets: it is claimed on the plan (`StepPlan.claim`), which
  schedules it once the evictions that make room for it are recorded;
- paused jobs on the device without a place are the eviction candidates; those not
  evicted still run if the budgets allow (work conservation: their KV is there);
- a job on the device whose KV the host tier cannot take now is *pinned* (swapping
  modes): a job without KV on the device (new, recomputed or swapped) never takes its
  place, since evicting it would discard its KV. The paper swaps and never recomputes
  (§4.2); where the host is too small to swap, keeping the KV is the nearest behaviour.
  Without this, MLFQ demotion and starvation promotion (Alg. 1, line 19) hand the device
  back and forth between long jobs whose KV is recomputed on every turn (issue 14.5);
- a starved job (promoted by Alg. 1 line 19) without KV that cannot start this step
  stops every new job after it in the order from starting (head-of-line for starved
  jobs only): otherwise smaller jobs behind it take the room as it frees and a long job
  waits without bound however often it is promoted;
- a job that came onto the device (admitted or swapped in) more recently than its
  eviction would cost (`protected`, the policy's churn bound) is pinned the same way, in
  every KV mode: §4.2's "kill and re-compute" deadlock, where a promoted job kills the
  job that just killed it, cannot recur faster than the work it throws away.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from andante.core.request import Request, RequestStatus
from andante.engine.plan import StepPlan
from andante.kv.block_manager import num_blocks_for

_NO_KV = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.SWAPPED


@dataclass(slots=True)
class StepChoice:
    """One step's places (lists in priority order); the batch is the plan's claims."""

    to_fetch: list[Request] = field(default_factory=list)  # swapped jobs with a place
    unplaced: list[Request] = field(default_factory=list)  # paused on the device, no place
    any_new: bool = False  # does the batch admit a job that holds no KV?


def device_capacity(plan: StepPlan, order: Sequence[Request]) -> int:
    """Device blocks the places may use (batches in a pipeline keep theirs)."""
    capacity = plan.num_blocks_above_watermark
    if plan.in_flight_ids:
        capacity -= sum(plan.num_blocks_of(r) for r in order if plan.is_in_flight(r))
    return capacity


def choose(plan: StepPlan, order: Sequence[Request], reserve: int, run_swapped: bool,
           bound_by_host: bool = True,
           protected: dict[Request, int] | None = None,
           starved: Collection[Request] = ()) -> StepChoice:
    """Places and the batch of placed jobs, from the top of `order`; `protected`: jobs
    on the device that keep their place (with their blocks), as pinned ones; `starved`:
    jobs promoted for starvation that no new job after them may overtake."""
    choice = StepChoice()
    bs = plan.block_size
    capacity = device_capacity(plan, order)
    held_capacity = capacity - reserve
    in_flight = plan.in_flight_ids
    used = 0
    # Started jobs keep their KV somewhere: admit a new one only while the two tiers
    # together can hold it, leaving a block of growth per started job.
    started = len(plan.running) + len(plan.swapped) + len(in_flight)
    room = plan.num_free_blocks + plan.num_free_host_blocks - started if bound_by_host \
        else math.inf
    pinned = _pinned(plan, order) if bound_by_host else {}
    if protected:
        pinned = {**pinned, **protected}
    pinned_left = sum(pinned.values())  # blocks of pinned jobs not walked yet
    blocked = False  # a starved job could not start: no new job after it may
    for req in order:
        status = req.status
        if status in _NO_KV:  # a new job gets a place only with one in the batch
            if blocked:
                continue
            # Its place holds all its tokens; every way a new job is turned away has
            # one effect (new jobs are never pinned), so the tests are taken at once.
            if used + pinned_left >= capacity:  # (the cheapest of them)
                blocked = bool(starved) and req in starved
                continue
            num_tokens = req.num_tokens
            n = num_tokens - req.num_computed_tokens
            blocks = num_blocks_for(num_tokens, bs)
            if used + pinned_left + blocks > capacity or plan.seq_budget < 1 \
                    or plan.token_budget < 1 or n > plan.token_budget \
                    or num_blocks_for(n, bs) > room:
                blocked = bool(starved) and req in starved
                continue
            used += blocks
            plan.claim(req, n)
            choice.any_new = True
            room -= blocks
            continue
        if status == _RUNNING and in_flight and req.request_id in in_flight:
            continue
        if used >= held_capacity and not (pinned and req in pinned):
            if status == _RUNNING:
                choice.unplaced.append(req)
            capacity = held_capacity  # the reserve is for jobs ahead of every denied one
            continue
        n = req.num_uncomputed_tokens
        blocks = num_blocks_for(req.num_computed_tokens + n, bs)  # (one call: a hot loop)
        if pinned:
            pinned_left -= pinned.get(req, 0)
        if used + pinned_left + blocks > held_capacity:
            if status == _RUNNING:
                choice.unplaced.append(req)
            capacity = held_capacity
            continue
        ready = status == _RUNNING or run_swapped
        if ready and not plan.can_claim(n):
            ready = False
        used += blocks
        if status == _SWAPPED:
            choice.to_fetch.append(req)
        if ready:
            plan.claim(req, n)
    return choice


def _pinned(plan: StepPlan, order: Sequence[Request]) -> dict[Request, int]:
    """Jobs on the device that the host tier cannot take, with the blocks their next
    iteration holds. The host is filled from the lowest priority up (the eviction order),
    so the jobs left swappable can all be swapped out together."""
    host_free = plan.num_free_host_blocks
    in_flight, bs = plan.in_flight_ids, plan.block_size
    out: dict[Request, int] = {}
    for req in reversed(order):
        if req.status != _RUNNING or (in_flight and plan.is_in_flight(req)):
            continue
        held = plan.num_blocks_of(req)
        if held <= host_free:
            host_free -= held
        else:  # the blocks of all its tokens (computed + uncomputed)
            out[req] = num_blocks_for(req.num_tokens, bs)
    return out


def fill(plan: StepPlan, spared: Sequence[Request], free: int) -> None:
    """Let paused jobs without a place that stay on the device run too, in order, while
    the budgets and the `free` device blocks allow."""
    for req in spared:
        if plan.seq_budget < 1:
            return
        n = req.num_uncomputed_tokens
        need = plan.blocks_needed(req, n)
        if need <= free and plan.can_claim(n):
            plan.claim(req, n)
            free -= need
