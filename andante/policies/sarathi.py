"""`sarathi`: chunked prefill under a per-step token budget, decodes first.

Design note: Sarathi-Serve (Agrawal et al., OSDI 2024, §4: stall-free batching).
Each step first advances every decoding request by one token, then continues
partially prefilled requests, then admits new ones, splitting prefills into chunks
so the step never exceeds `token_budget` tokens (512 in the paper's strict-SLO
setting, 2048 in the relaxed one). A new request is admitted only if its whole
prompt would fit in free blocks, so chunks do not strand each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from andante.core.request import Request
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy
from andante.policies.phases import advance_with_preemption, by_arrival, swap_in_in_order


@dataclass(frozen=True, slots=True)
class SarathiOptions:
    token_budget: int = 512

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")


def _decode_tokens(req: Request) -> int:
    return 1 if req.num_uncomputed_tokens == 1 else 0


class SarathiPolicy(BasePolicy):
    name = "sarathi"
    Options = SarathiOptions
    stationary = True

    def schedule(self, plan: StepPlan) -> None:
        plan.restrict_token_budget(self.options.token_budget)
        plan.waiting.sort(key=by_arrival)
        advance_with_preemption(plan, plan.running, _decode_tokens)
        self._continue_prefills(plan)
        if not plan.preemptions:
            swap_in_in_order(plan, plan.swapped)
        if not plan.swapped:
            self._admit_chunks(plan)

    def _continue_prefills(self, plan: StepPlan) -> None:
        for req in plan.running:
            if req.num_uncomputed_tokens > 1 and not plan.is_preempted(req):
                n = plan.max_schedulable_tokens(req)
                if n > 0:
                    plan.schedule(req, n)

    def _admit_chunks(self, plan: StepPlan) -> None:
        for req in plan.waiting:
            if not plan.has_seq_room or not plan.can_reserve_prefill(req):
                return
            n = plan.max_schedulable_tokens(req)
            if n < 1:
                return
            plan.schedule(req, n)
