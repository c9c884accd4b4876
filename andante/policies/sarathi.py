"""`sarathi`: vLLM v1's loop under a small per-step token budget.

Design note: Sarathi-Serve (Agrawal et al., OSDI 2024, §4: stall-free batching) is
chunked prefill with decodes never stalled: each step's token budget (512 in the
paper's strict-SLO setting, 2048 in the relaxed one) is filled with the running
requests first and then new prefills, split into chunks. That is the `vllm` policy's
loop with a smaller budget (`token_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass

from andante.engine.plan import StepPlan
from andante.policies.vllm import VLLMPolicy


@dataclass(frozen=True, slots=True)
class SarathiOptions:
    token_budget: int = 512

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")


class SarathiPolicy(VLLMPolicy):
    name = "sarathi"
    Options = SarathiOptions

    def schedule(self, plan: StepPlan) -> None:
        plan.restrict_token_budget(self.options.token_budget)
        super().schedule(plan)
