"""The Andes experiment's chunked-prefill section (issue 14 item 6).

Design note. On long-prompt workloads Andes' prefill-first steps (vLLM v0, as in the
paper) stall every running stream for a whole prefill, and its size-aware priority
(gain per KV block, Eq. 6) leaves the longest prompts waiting longest. Sarathi-Serve's
chunked prefill (OSDI 2024, §4) bounds the stall instead. This section runs one cyclic
burst of long prompts on the ablation setup (Llama-3.1-70B, 8xA100) and compares
andes (prefill-first), andes with chunked prefill (its knapsack's decision carried out
in vLLM-v1 steps with at most 1,024 prompt tokens per step, `chunked_prefill=true`),
sarathi (512-token budget) and the paper's vllm baseline, reporting mean QoE and TTFT p99 by
prompt-length bucket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from andante.bench.report import Report
from experiments.andes_runs import Job, Outcome, Setup

if TYPE_CHECKING:
    from experiments.andes import Plan

POLICIES = ("vllm", "sarathi", "andes", "andes-chunked")
LENGTHS = "uniform:1000:7500:100:500"  # prompts 1k-7.5k tokens, outputs 100-500
BUCKETS = (1000, 2000, 4000, 8192)  # prompt-length bucket edges (tokens)
INTENSITY, SHARE = 2.0, 0.35

TEXT = f"""Long prompts ({LENGTHS.split(':', 1)[1].replace(':', ' / ')}: prompt min/max,
output min/max tokens) in one cyclic burst (intensity {INTENSITY:g}, {SHARE:.0%} of the cycle)
on the ablation setup. andes: the paper's prefill-first steps; andes-chunked: the same
knapsack decisions carried out as chunked-prefill steps (at most 1,024 prompt tokens per
step; a request never served past its TTFT target admitted first, without the
refiner's weighing); sarathi: FCFS with
512-token chunks; vllm: the paper's prefill-first FCFS baseline. Mean QoE and TTFT p99
per prompt-length bucket; "all" is the whole run."""


def key(s: Setup, policy: str) -> str:
    return f"long/{s.key}/{policy}"


def jobs(plan: Plan, rate: float, seed: int, variant: Any) -> list[Job]:
    """One job per policy; `rate` in requests/s (the plan's `long_prompt_rate`)."""
    s = plan.ablation
    workload = s.workload(rate=rate, lengths=LENGTHS, burst_intensity=INTENSITY,
                          burst_share=SHARE, seed=seed)
    return [Job(key(s, p), s.spec(*variant(p)), workload, until=4.0 * s.cycle, detail=True)
            for p in POLICIES]


def bucket_rows(out: Outcome) -> list[dict[str, Any]]:
    """Mean QoE and TTFT p99 (s) of each prompt-length bucket, then of all requests."""
    assert out.prompts is not None and out.qoe is not None and out.ttft is not None
    edges = list(zip(BUCKETS[:-1], BUCKETS[1:], strict=True))
    rows = []
    for lo, hi in [*edges, (0, None)]:
        mask = out.prompts >= lo if hi is None else (out.prompts >= lo) & (out.prompts < hi)
        ttft = out.ttft[mask]
        ttft = ttft[np.isfinite(ttft)]
        rows.append({"prompt tokens": "all" if hi is None else f"{lo}-{hi - 1}",
                     "requests": int(mask.sum()),
                     "mean QoE": float(out.qoe[mask].mean()) if mask.any() else None,
                     "TTFT p99 (s)": float(np.percentile(ttft, 99)) if len(ttft) else None})
    return rows


def section(report: Report, plan: Plan, outcomes: dict[str, Outcome]) -> dict[str, Any]:
    report.section("Chunked prefill: andes, andes with chunks, sarathi", TEXT)
    s = plan.ablation
    table, result = [], {}
    for p in POLICIES:
        rows = bucket_rows(outcomes[key(s, p)])
        result[p] = rows
        table += [{"policy": p, **r} for r in rows]
    report.table(table)
    return result
