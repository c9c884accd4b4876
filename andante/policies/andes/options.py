"""Andes' tunables (`AndesOptions`): defaults from the paper where it gives a value and
from Andes' public code (a vLLM fork) where it is silent; see each field's note."""

from __future__ import annotations

import math
from dataclasses import dataclass

SOLVERS = ("greedy", "dp")
OBJECTIVES = ("avg", "min", "perfect")
PREEMPTIONS = ("auto", "swap", "recompute")


@dataclass(frozen=True, slots=True)
class AndesOptions:
    """Defaults follow the paper where it gives a value and Andes' public code (vLLM
    fork) where it is silent.

    delta_t: QoE-gain horizon Δt (s). watermark: KV usage that triggers the solver.
    solver_interval: the solver may run every this many steps. solver: "greedy"
    (Alg. 1) or "dp" (Appendix C). objective: "avg" QoE, "min" (max-min QoE) or
    "perfect" (number of requests at QoE 1), Appendix A. refiner: §4.3 on/off.
    refine_admissions: the refiner also weighs admissions that preempt nobody (their
    prefill stalls the running streams); False keeps every one that fits. A starved
    request (see starvation_limit) is never weighed: its Δt gain is ~0 (its QoE at
    now + Δt is lost served or not), so it would never outweigh a stall again.
    None (the default): only with prefill-first steps. With chunked prefill an
    admission's prompt shares steps with the running streams in chunks, so the refiner's
    stall estimate overstates its cost; under compute-bound overload (every reader
    already behind) it then refused almost every admission. Simulated on the calibrated
    `cpu` profile, SmolLM2, Poisson 2 req/s (issue 15): TTFT p99 1.99 s and mean QoE
    0.753 with it, 0.97 s and 0.802 without (vllm: 0.97 s, 0.802).
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
    chunked_prefill: steps as vLLM v1 / Sarathi-Serve instead of v0's prefill-first
    ones: the chosen running requests advance first (a decode token, or the next chunk
    of a prefill), then the chosen admissions prefill in chunks within what is left of
    the step's token budget. chunk_tokens: at most this many prompt tokens per step
    when chunking: the step's budget is one token per running request plus this, capped
    by the engine's max_num_batched_tokens (0: that cap alone). Measured in the
    simulator on long prompts (the experiment's chunked-prefill section; Llama-3.1-70B,
    burst of 1-7.5k-token prompts): mean QoE 0.929 at 512, 0.936 at 1024, 0.849 at 2048
    (a large chunk stalls the streams again); 512 chunks also took ~1.5x the scheduler
    iterations of 1024 on ShareGPT. (Unlike Sarathi-Serve's budget it does not shrink
    as the batch grows: with hundreds of streams that would leave no room to prefill.)
    starvation_limit: a request never served that has waited this many seconds past its
    TTFT target goes before every other queued request (the longest-waiting first) and
    skips the refiner. The Δt gain of such a request is ~0 whether it is served or not,
    so under overload gain-ordered admission serves newer arrivals first indefinitely
    and the TTFT tail grows without bound (the real engine's 9-10 s TTFT p99 at 2 req/s,
    issue 15). None (the default): 0 with chunked prefill (late requests first come,
    first served), no limit with prefill-first steps (the paper's Andes).
    pause_buffered_s: with chunked prefill, in a step that admits queued requests while
    all of them fit (at most half the sequence slots, free memory, a token budget that
    running prompt chunks leave room in: otherwise the queue waits for running streams,
    and slowing them would make it wait longer), the running streams whose pacer holds
    more than this many seconds of text sit the step out: their reader does not notice
    a one-step pause (their Δt gain is nil, §3.2), and the step, which the newcomers'
    first tokens wait for (and so does every request that arrives meanwhile), no longer
    reads their KV or computes their rows. Slack spent on admitting earlier: no KV is
    freed, nothing is preempted. 0 turns it off. Simulated on the calibrated `cpu`
    profile, SmolLM2, serve_vs_vllm's burst workload (10 seeds, issue 15): at 2 req/s
    TTFT p99 338 -> 306 ms (median of seeds; mean 336 -> 290), mean TPOT 59.8 -> 66.6
    ms, QoE 1.000 either way; at 3 req/s (overload) p99 468 -> 460 ms, mean QoE 0.991
    -> 0.989. The quick reproduction (`experiment andes --quick`) is unchanged.
    """

    delta_t: float = 10.0
    watermark: float = 0.9
    solver_interval: int = 10
    solver: str = "greedy"
    objective: str = "avg"
    refiner: bool = True
    refine_admissions: bool | None = None
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
    chunked_prefill: bool = True
    chunk_tokens: int = 1024
    starvation_limit: float | None = None
    pause_buffered_s: float = 1.0

    def __post_init__(self) -> None:
        if self.starvation_limit is not None and not self.starvation_limit >= 0:
            raise ValueError(f"starvation_limit must be >= 0 or None, got "
                             f"{self.starvation_limit!r}")
        for name, value, valid in (
            ("solver", self.solver, SOLVERS),
            ("objective", self.objective, OBJECTIVES),
            ("preemption", self.preemption, PREEMPTIONS),
        ):
            if value not in valid:
                raise ValueError(f"{name} must be one of {valid}, got {value!r}")
        fin = math.isfinite
        rules: tuple[tuple[str, bool, str], ...] = (
            ("delta_t", fin(self.delta_t) and self.delta_t > 0, "> 0 s"),
            ("watermark", 0 <= self.watermark <= 1, "in [0, 1]"),
            ("solver_interval", self.solver_interval >= 1, ">= 1"),
            ("stall_weight", fin(self.stall_weight) and self.stall_weight >= 0, ">= 0"),
            ("running_bonus", fin(self.running_bonus) and self.running_bonus >= 0, ">= 0"),
            ("max_batch_candidates", self.max_batch_candidates >= 0, ">= 0"),
            ("dp_max_items", self.dp_max_items >= 1, ">= 1"),
            ("dp_capacity_units", self.dp_capacity_units >= 1, ">= 1"),
            ("slack_percentile", 0 <= self.slack_percentile <= 1, "in [0, 1]"),
            ("max_preemptions", self.max_preemptions is None or self.max_preemptions >= 0,
             ">= 0 or None"),
            ("latency_ema", 0 < self.latency_ema <= 1, "in (0, 1]"),
            ("chunk_tokens", self.chunk_tokens >= 0, ">= 0"),
            ("pause_buffered_s", fin(self.pause_buffered_s) and self.pause_buffered_s >= 0,
             ">= 0 s"),
        )
        for name, ok, rule in rules:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")
