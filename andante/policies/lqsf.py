"""`lqsf`: Least QoE Slack First, the baseline of Andes §6.1.

Design note. Andes configures vLLM with "a custom scheduling algorithm, Least QoE Slack
First (LQSF), which prioritizes requests most at risk of QoE degradation based on the
QoE gain we defined" and notes that it "fails to account for the resource usage of
requests" (§6.3). So LQSF is Andes' machinery with the priority reduced to the QoE
gain over Δt itself (not per KV block), no batch-size search (B = what memory holds),
no overhead-aware refiner and no pacer-driven preemption between solves; it keeps
Andes' selective triggering and per-request choice of the cheaper preemption. As in
Andes' public LQF code, a decision preempts at most one running request (without that
cap the gain-only priority preempts without bound and the engine thrashes).
"""

from __future__ import annotations

from dataclasses import dataclass

from andante.policies.andes import AndesOptions, AndesPolicy


@dataclass(frozen=True, slots=True)
class LQSFOptions(AndesOptions):
    size_aware: bool = False
    batch_search: bool = False
    refiner: bool = False
    refine_admissions: bool | None = False
    pacer_aware: bool = False
    max_preemptions: int | None = 1
    chunked_prefill: bool = False  # vLLM v0's prefill-first steps, as the paper's baseline


class LQSFPolicy(AndesPolicy):
    name = "lqsf"
    Options = LQSFOptions
    chunks_prefill = False


__all__ = ["LQSFOptions", "LQSFPolicy"]
