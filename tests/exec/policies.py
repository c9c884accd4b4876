"""A test policy that forces one preemption (swap or recompute) at a chosen step."""

from __future__ import annotations

from dataclasses import dataclass

from andante.core.request import PreemptionMode
from andante.engine.plan import StepPlan
from andante.policies.vllm import VLLMPolicy


@dataclass(frozen=True, slots=True)
class ForcedOptions:
    victim: str = ""  # request id to preempt
    mode: str = "swap"  # or "recompute"
    at_step: int = 3


class ForcedPreemptionPolicy(VLLMPolicy):
    """vLLM's policy, plus: at step `at_step`, preempt request `victim` by `mode`. The
    vLLM policy brings a swapped request back in the next step without preemptions,
    and re-prefills a recomputed one from the front of the queue."""

    name = "forced-preemption"
    Options = ForcedOptions

    def __init__(self, ctx):  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.num_steps = 0
        self.done = False

    def schedule(self, plan: StepPlan) -> None:
        self.num_steps += 1
        opts = self.options
        if not self.done and self.num_steps >= opts.at_step:
            mode = PreemptionMode[opts.mode.upper()]
            for req in plan.running:
                if req.request_id == opts.victim and plan.can_preempt(req, mode):
                    plan.preempt(req, mode)
                    self.done = True
        super().schedule(plan)


POLICY = f"{__name__}:ForcedPreemptionPolicy"
