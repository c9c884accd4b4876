"""Fixed text of the FastServe report: the paper's numbers and why ours differ."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# FastServe (arXiv 2305.05920v3) §6.2-§6.3, read from the text of the paper.
PAPER = {
    "avg_vs_vllm_max": 31.4,  # Alpaca, the headline (abstract, §8)
    "tail_vs_vllm_max": 17.9,  # ShareGPT, P95
    "avg_vs_vllm_sharegpt": (2.3, 18.3),
    "avg_vs_vllm_alpaca": (3.0, 31.4),
    "avg_vs_fcfs_sharegpt": (2.0, 4.0),
    "tail_vs_fcfs_13b_66b": (2.0, 2.8),
    "tail_vs_fcfs_175b": 1.5,
    "proactive_vs_recompute": 2.7,
    "proactive_vs_reactive": 1.7,
    "fig8_peak_kv_mlfq_over_fcfs": 7.0,
}


def paper_rows() -> list[dict[str, Any]]:
    return [
        {"claim": "FastServe vs vLLM, average latency SLO", "paper": "up to 31.4x (Alpaca); "
         "2.3-18.3x on ShareGPT (OPT-13B/66B/175B)"},
        {"claim": "FastServe vs vLLM, P95 latency SLO", "paper": "up to 17.9x (ShareGPT)"},
        {"claim": "FastServe vs FastServe-FCFS", "paper": "2-4x (ShareGPT), 1.6-2x (Alpaca); "
         "P95: 2-2.8x (13B, 66B), 1.5x (175B)"},
        {"claim": "FastServe-FCFS vs vLLM", "paper": "> 1x from the engine alone (C++, fused "
         "kernels): part of every FastServe-vs-vLLM multiple"},
        {"claim": "proactive swapping vs recompute / reactive", "paper": "2.7x / 1.7x"},
        {"claim": "peak KV memory, MLFQ vs FCFS (Fig. 8)", "paper": "up to 7x"},
    ]


def _range(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "n/a"
    lo, hi = min(finite), max(finite)
    return f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}x"


def _multiples(panels: Sequence[dict[str, Any]], stat: str, base: str) -> str:
    return _range([p["multiples"][stat][base] for p in panels])


def differences(panels: Sequence[dict[str, Any]]) -> str:
    """The closing discussion, with this run's ranges filled in."""
    share = [p for p in panels if "skewed" not in p["key"]]
    skew = [p for p in panels if "skewed" in p["key"]]
    cut = _range([p["latency_cut"]["mean"] for p in share])
    lines = [
        f"This run, ShareGPT panels: FastServe sustains {_multiples(share, 'mean', 'vllm')} "
        f"the rate of vLLM within the average-latency SLO and "
        f"{_multiples(share, 'p95', 'vllm')} within the P95 SLO (FastServe-FCFS: "
        f"{_multiples(share, 'mean', 'fastserve-fcfs')} / "
        f"{_multiples(share, 'p95', 'fastserve-fcfs')}); at the highest rate vLLM "
        f"sustains, FastServe's mean latency is {cut} lower.",
    ]
    if skew:
        lines.append(
            f"Skewed mix (many short jobs, a few long ones): {_multiples(skew, 'mean', 'vllm')} "
            f"(average) and {_multiples(skew, 'p95', 'vllm')} (P95) over vLLM.")
    return "\n".join(lines) + "\n" + _REASONS


_REASONS = """
The paper reports up to 31.4x (average) and 17.9x (P95) over vLLM. Why the gap:

1. The same capacity wall. Every policy here runs on the same simulated engine and
   cost model, so all three saturate at about the same throughput: on ShareGPT the
   OPT-13B setup is bound by the KV cache (about 13 jobs fit) and the 70B setups by the
   batch size. Skip-join MLFQ cuts the latency below the wall several-fold, but per-token
   latency climbs steeply at the wall for every scheduler, so the highest rate within
   the SLO moves only a little. Gains in rate need either more capacity or much more
   skew in job sizes (the skewed panel, and the paper's Alpaca runs).
2. One engine for all. The paper's multiples over vLLM include its own engine's speed:
   FastServe-FCFS already beats vLLM 0.1.7 there, thanks to a C++ engine with fused
   kernels, which moves the wall itself. Here the multiples measure scheduling alone;
   the paper's scheduling-only gain is FastServe vs FastServe-FCFS (2-4x on ShareGPT).
3. A stronger vLLM baseline. `vllm` here is vLLM's later v0 scheduler (policy `vllm-v0`:
   iteration-level, prefill-first, recompute of the newest request) on the same step-time
   model.
4. Lengths. ShareGPT here is the Llama-2-tokenized 8k set cut at 2048 tokens (mean
   prompt ~610, output ~395 tokens, output CV ~0.6): jobs are long and similar, which is
   where MLFQ (an approximation of shortest-remaining-first) has least to gain.
5. Models. Llama-3.1-70B uses grouped-query attention: its KV cache is 8x smaller per
   token than OPT-66B/175B's, so the 4- and 8-GPU setups are bounded by the batch size
   (64 here; the paper's is unstated) rather than by KV memory, and swapping hardly
   matters there. OPT-13B on one A100-40G is the KV-bound case closest to the paper.
6. Swaps. Copies overlap a step's forward pass only when that step does not need the
   blocks, a copy cannot span two steps, and the host link is PCIe 4.0 at 25 GB/s.
   Reactive swapping and recompute suffer more here than in the paper (Fig. 15 table):
   under overload, starvation promotions pull deep jobs back for a few iterations each,
   and without a budget on the copies (reactive) or with recomputation, that churn is
   paid on the critical path.
7. Starvation limit. The paper's alpha rule is unstated; FastServe's code uses 3 s.
   Here alpha = 250 x SLO (sensitivity table above): 3 s costs 2-3x in mean latency.
8. Pipeline parallelism. The paper serves OPT-175B on 16 GPUs in two nodes with PP and
   vLLM with TP only. On one simulated NVLink node TP 8 beats TP 4 x PP 2 for latency, so
   the PP panel runs all three policies on the same TP 4 x PP 2 instance: it shows the
   in-flight semantics (§4.3), not a topology comparison.
"""
