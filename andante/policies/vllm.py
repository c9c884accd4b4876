"""`vllm`: vLLM v1's scheduling loop (the default), and `sarathi`: the same loop under a
small token budget.

Design note: vLLM v1's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py). There
are no phases: every request advances by `num_tokens - num_computed_tokens` capped by
what is left of the step's token budget, so a long prompt is prefilled in chunks and
prefills share steps with decodes. Running requests go first, in admission order; when
one's blocks cannot be allocated, requests are preempted from the back of the running
list (recompute, or swap in swap mode) until it fits or it is itself preempted. Then,
in a step that preempted nobody, swapped requests come back in order and, while none
remain swapped, waiting requests are admitted in queue order (preempted ones at its
front) until one does not fit. Sarathi-Serve (Agrawal et al., OSDI 2024, §4:
stall-free batching) is this loop with a small budget (512 tokens in the paper's
strict-SLO setting, 2048 in the relaxed one).
"""

from __future__ import annotations

from dataclasses import dataclass

from andante.engine.fast_path import FastPathDefaults
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy
from andante.policies.phases import (
    admit_in_order,
    advance_with_preemption,
    budgeted,
    swap_in_in_order,
)


class VLLMPolicy(BasePolicy, FastPathDefaults):
    name = "vllm"
    stationary = True  # queue order and blocks alone decide: same state, same decision
    chunks_prefill = True  # `budgeted`: any prompt advances by the budget left

    @property
    def prefill_run_budget(self) -> int:
        """The step's token budget: running requests advance in order by their tokens
        capped by what is left of it (andante.sim.prefill_run)."""
        return self.ctx.config.max_num_batched_tokens

    @property
    def decode_budget(self) -> int:
        """Running decodes advance together, in order, up to the budget
        (andante.sim.after_finish)."""
        return self.prefill_run_budget

    def schedule(self, plan: StepPlan) -> None:
        num_tokens = budgeted(plan)
        advance_with_preemption(plan, plan.running, num_tokens)
        if plan.preemptions:
            return
        swap_in_in_order(plan, plan.swapped, num_tokens)
        if all(plan.is_scheduled(r) for r in plan.swapped):  # none left on the host
            admit_in_order(plan, plan.waiting, num_tokens)


@dataclass(frozen=True, slots=True)
class SarathiOptions:
    token_budget: int = 512

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")


class SarathiPolicy(VLLMPolicy):
    name = "sarathi"
    Options = SarathiOptions

    @property
    def prefill_run_budget(self) -> int:
        return min(self.ctx.config.max_num_batched_tokens, self.options.token_budget)

    def schedule(self, plan: StepPlan) -> None:
        plan.restrict_token_budget(self.options.token_budget)
        super().schedule(plan)
