"""FastServe's churn bound: a job is not evicted before it has paid for its eviction.

Design note: FastServe §4.2 names the failure of its second strawman: with "kill and
re-compute", starvation promotion (Alg. 1, line 19) lets a promoted job kill the job
that just killed it, and long jobs hand the device back and forth, each turn
recomputing a prompt (issue 30: 413 preemptions per request on 20k-80k-token prompts).
Swapping (§4.2's answer) only makes the turns cheaper. The bound is the ski-rental
rule: a job that came onto the device (admitted, resumed or swapped in) at time t may
be evicted only once it has held the device for as long as its eviction costs it, after
the work that brought it there: the prefill of its computed tokens when its KV is
dropped (so twice that from its admission, whose step recomputes them), the copy out
and back when it is swapped. Until then it keeps its place like a pinned job
(`choice.choose`) and is no victim (`KVPlanner.protected`): the work thrown away is at
most the work done. Wall time alone does not bound the churn where steps are long (a
batch with a long prefill lasts seconds, so a job can "pay" for its eviction with one
token): a job whose KV was dropped `max_evictions` times keeps its place to its end (a
swap throws no work away; swapped jobs have the hold time alone). Protected jobs are
taken in job order while they fit the device together (beside the reserve for
arrivals), and a step that still finds no room for the jobs it runs evicts protected
ones last (`KVPlanner.apply`): the bound never leaves a step without progress.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.plan import StepPlan
from andante.perf.cost_model import CostModel

_RUNNING = RequestStatus.RUNNING


class ChurnBound:
    """When each job came onto the device, and which may not be evicted yet."""

    def __init__(self, cost_model: CostModel | None, swaps: bool, prefill_rate: float,
                 max_evictions: int | None) -> None:
        self.cost_model = cost_model
        self.swaps = swaps  # evictions swap (else they drop the KV: recompute)
        self.prefill_rate = prefill_rate  # tokens/s without a cost model
        self.max_evictions = max_evictions  # then it keeps the device to its end
        self._since: dict[Request, float] = {}
        self._evictions: dict[Request, int] = {}

    def eviction_cost(self, req: Request, num_slots: int) -> float:
        """Seconds the job loses if evicted now (`num_slots`: the tokens its blocks hold)."""
        cost = self.cost_model
        if self.swaps:
            if cost is None:
                return 0.0
            return 2.0 * cost.swap_time(num_slots)
        computed = req.num_computed_tokens  # recomputed on its return
        if cost is None:
            return computed / self.prefill_rate
        return cost.prefill_time(computed, 0) if computed > 1 else 0.0

    def hold_time(self, req: Request, num_slots: int) -> float:
        """How long the job keeps the device once on it: its eviction cost after the
        work that brought it back (a recompute's prefill is that cost itself)."""
        cost = self.eviction_cost(req, num_slots)
        return cost if self.swaps else 2.0 * cost

    def longest_hold(self, device_slots: int) -> float:
        """A bound on `hold_time` of any job on a device of `device_slots` tokens
        (math.inf: none known): a swap's cost grows with the tokens copied, and a job
        holds at most the device; a recompute's prefill time need not grow."""
        cost = self.cost_model
        if not self.swaps:
            return math.inf
        return 2.0 * cost.swap_time(device_slots) if cost is not None else 0.0

    def protected(self, plan: StepPlan, order: Sequence[Request],
                  reserve: int = 0) -> dict[Request, int]:
        """Running jobs on the device that have not yet held it for their eviction
        cost, or were evicted `max_evictions` times already, with the blocks of all
        their tokens: in job order, while they fit the device together."""
        since, now = self._since, plan.now
        if not since:
            return {}
        out: dict[Request, int] = {}
        room = plan.num_blocks_above_watermark - reserve
        evictions, cap = self._evictions, self.max_evictions
        longest = self.longest_hold(plan.num_slots_in(plan.num_total_blocks))
        for req in order:
            if req.status != _RUNNING:
                continue
            start = since.get(req)
            if start is None:
                continue
            held = now - start
            if (cap is not None and evictions.get(req, 0) >= cap) or (held < longest and held <
                    self.hold_time(req, plan.num_slots_in(plan.num_blocks_of(req)))):
                blocks = plan.num_blocks_for(req.num_tokens + 1)  # room to grow
                if blocks > room:
                    break
                room -= blocks
                out[req] = blocks
        return out

    def after_step(self, plan: StepPlan) -> None:
        """Record the jobs that came onto the device this step and those that left."""
        since, now = self._since, plan.now
        for req, mode in plan.preemptions:
            since.pop(req, None)
            if mode == PreemptionMode.RECOMPUTE:
                self._evictions[req] = self._evictions.get(req, 0) + 1
        for req in plan.scheduled:
            if req not in since:
                since[req] = now
        for req in plan.swap_ins:
            since[req] = now

    def forget(self, req: Request) -> None:
        self._since.pop(req, None)
        self._evictions.pop(req, None)
