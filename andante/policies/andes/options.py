"""Tunables of the `andes` policy (and of `lqsf`, which presets some of them).

Defaults follow the paper where it gives a value and Andes' public code (vLLM fork)
where it is silent: Δt = 10 s; solver considered every 10 engine steps and run only
when KV usage ≥ 0.9 (or, §4.2, when the observed token latency exceeds the most
stringent reader's pace); running requests get a 10 % priority bonus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SOLVERS = ("greedy", "dp")
OBJECTIVES = ("avg", "min", "perfect")
PREEMPTIONS = ("auto", "swap", "recompute")


@dataclass(frozen=True, slots=True)
class AndesOptions:
    """delta_t: QoE-gain horizon Δt (s). watermark: KV usage that triggers the solver.
    solver_interval: the solver may run every this many steps. solver: "greedy"
    (Alg. 1) or "dp" (Appendix C). objective: "avg" QoE, "min" (max-min QoE) or
    "perfect" (number of requests at QoE 1), Appendix A. refiner: §4.3 on/off.
    refine_admissions: the refiner also weighs admissions that preempt nobody (their
    prefill stalls the running streams); False keeps every one that fits.
    stall_weight: multiplies the refiner's estimate of what a stall costs the running
    streams. 1 is the paper's estimate (their QoE lost over Δt); the default 10 was
    calibrated in the simulator (see the experiment report): the Δt estimate counts only
    the tokens due within Δt, while a stall delays every later token of every running
    stream, and an admission's gain assumes it would otherwise wait the whole Δt.
    preemption: "auto" picks the cheaper of swap and recompute per request.
    running_bonus: priority bonus of running requests. size_aware: priority is gain
    per KV block (False: gain alone, as LQSF). batch_search: search B in
    [B_min, B_max] (False: B = B_max). max_batch_candidates: at most this many B
    values are evaluated (evenly spread, ends included; 0 = all). pacer_aware:
    between solver runs, readers buffered beyond Δt may be preempted for waiting
    requests. dp_max_items / dp_capacity_units bound the DP (items kept by
    priority; capacity coarsened to this many units; exact below both).
    latency_ema: weight of a new observation in the online latency estimates.
    slack_percentile: the refiner's preemption budget is this percentile of the
    ongoing requests' slack (public code: 10 %; 1 = the largest slack, no budget).
    max_preemptions: at most this many preemptions per decision (None: no cap).
    """

    delta_t: float = 10.0
    watermark: float = 0.9
    solver_interval: int = 10
    solver: str = "greedy"
    objective: str = "avg"
    refiner: bool = True
    refine_admissions: bool = True
    stall_weight: float = 10.0
    preemption: str = "auto"
    running_bonus: float = 0.1
    size_aware: bool = True
    batch_search: bool = True
    max_batch_candidates: int = 16
    pacer_aware: bool = True
    dp_max_items: int = 256
    dp_capacity_units: int = 256
    latency_ema: float = 0.1
    slack_percentile: float = 0.1
    max_preemptions: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delta_t) and self.delta_t > 0):
            raise ValueError(f"delta_t must be a positive number of seconds, got {self.delta_t!r}")
        if not 0 <= self.watermark <= 1:
            raise ValueError(f"watermark must be in [0, 1], got {self.watermark!r}")
        if self.solver_interval < 1:
            raise ValueError(f"solver_interval must be >= 1, got {self.solver_interval!r}")
        for name, value, valid in (
            ("solver", self.solver, SOLVERS),
            ("objective", self.objective, OBJECTIVES),
            ("preemption", self.preemption, PREEMPTIONS),
        ):
            if value not in valid:
                raise ValueError(f"{name} must be one of {valid}, got {value!r}")
        if not (math.isfinite(self.stall_weight) and self.stall_weight >= 0):
            raise ValueError(f"stall_weight must be >= 0, got {self.stall_weight!r}")
        if not (math.isfinite(self.running_bonus) and self.running_bonus >= 0):
            raise ValueError(f"running_bonus must be >= 0, got {self.running_bonus!r}")
        if self.max_batch_candidates < 0:
            raise ValueError(
                f"max_batch_candidates must be >= 0, got {self.max_batch_candidates!r}"
            )
        if self.dp_max_items < 1 or self.dp_capacity_units < 1:
            raise ValueError(
                f"dp_max_items and dp_capacity_units must be >= 1, got "
                f"{self.dp_max_items!r}, {self.dp_capacity_units!r}"
            )
        if not 0 <= self.slack_percentile <= 1:
            raise ValueError(f"slack_percentile must be in [0, 1], got {self.slack_percentile!r}")
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise ValueError(f"max_preemptions must be >= 0, got {self.max_preemptions!r}")
        if not 0 < self.latency_ema <= 1:
            raise ValueError(f"latency_ema must be in (0, 1], got {self.latency_ema!r}")
