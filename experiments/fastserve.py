"""`andante experiment fastserve`: FastServe's evaluation (§6) on simulated GPUs.

Design note: FastServe §6.1-§6.3. Fig. 11/12: mean and p95 per-token latency (e2el /
output tokens) against the Poisson arrival rate for vllm, fastserve-fcfs (the paper's
ablation: same engine and swapping, FCFS order) and fastserve, ShareGPT lengths; the
highest rate each sustains within SLO = 10x a decode iteration (§6.1), read off the
curves, and the multiples over vllm. Fig. 8: KV memory over time under FCFS and MLFQ
(Gamma arrivals, CV 4, outputs <= 20 tokens). Fig. 15(a): proactive swapping against
reactive swapping and recompute. Plus two sensitivities the paper leaves open: the
starvation limit alpha and the batch size, and a case it does not cover: long prompts
with a host tier too small to swap them (issue 14.5, where MLFQ used to thrash).
FastServe-FCFS runs beside FastServe everywhere, so the share of the gain over vLLM due
to the MLFQ itself (rather than to the engine's swapping) is read off each panel. Every
policy runs on the same simulated engine, so the multiples measure scheduling alone (see
the report's "differences" section).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from andante.bench.report import Report
from andante.engine.config import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import WorkloadConfig, build_workload
from experiments import fastserve_plots as plots
from experiments.fastserve_runs import (
    Point,
    Setup,
    gamma_burst,
    max_rate_within,
    run_point,
    sharegpt_poisson,
    value_at,
)
from experiments.fastserve_text import differences, paper_rows
from experiments.registry import ExperimentContext

POLICIES = ("vllm", "fastserve-fcfs", "fastserve")
ALPHA_SLO_MULTIPLE = 250.0  # alpha, "tuned from the SLO" (§4.1): 250 tokens at the SLO
SETUPS = (
    Setup("opt13b-1gpu", "OPT-13B, 1 x A100-40G, ShareGPT", "opt-13b", "a100-40g", tp=1,
          pp=1, max_num_seqs=256, rates=(0.25, 0.5, 0.75, 0.875, 1.0, 1.125, 1.25, 1.5, 2.0),
          quick_rates=(0.5, 1.0, 2.0)),
    Setup("opt13b-1gpu-skewed", "OPT-13B, 1 x A100-40G, skewed mix", "opt-13b", "a100-40g",
          tp=1, pp=1, max_num_seqs=256, rates=(1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 6.0, 8.0, 12.0),
          quick_rates=(2.0, 4.0, 8.0), workload="skewed"),
    Setup("llama70b-4gpu", "Llama-3.1-70B, 4 x A100-80G (TP 4), ShareGPT", "llama-3.1-70b",
          "a100-80g", tp=4, pp=1, max_num_seqs=64,
          rates=(1.0, 2.0, 2.5, 2.75, 3.0, 3.25, 3.5, 4.0, 5.0), quick_rates=()),
    Setup("llama70b-8gpu", "Llama-3.1-70B, 8 x A100-80G (TP 8), ShareGPT", "llama-3.1-70b",
          "a100-80g", tp=8, pp=1, max_num_seqs=64,
          rates=(2.0, 3.0, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0), quick_rates=(3.0, 6.0, 9.0)),
    Setup("llama70b-8gpu-pp", "Llama-3.1-70B, 8 x A100-80G (TP 4 x PP 2), ShareGPT",
          "llama-3.1-70b", "a100-80g", tp=4, pp=2, max_num_seqs=64,
          rates=(2.0, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0), quick_rates=(3.0, 6.0)),
)


def _log(message: str) -> None:
    print(f"[fastserve] {message}", file=sys.stderr, flush=True)


def fastserve_options(setup: Setup, **extra: Any) -> dict[str, Any]:
    return {"starve_limit": round(ALPHA_SLO_MULTIPLE * setup.slo(), 3), **extra}


def _options(setup: Setup, policy: str) -> dict[str, Any]:
    return fastserve_options(setup) if policy == "fastserve" else {}


def sweep(setup: Setup, rates: Sequence[float], num_requests: int, seed: int) -> dict[str, Any]:
    """One panel: every policy at every rate, on the same workload per rate."""
    curves: dict[str, dict[str, list[float]]] = {
        p: {"mean": [], "p95": [], "finished": []} for p in POLICIES}
    wall = 0.0
    for rate in rates:
        workload = setup.make_workload(rate, num_requests, seed)
        for policy in POLICIES:
            point = run_point(setup.spec(policy, _options(setup, policy)), workload)
            curves[policy]["mean"].append(point.mean)
            curves[policy]["p95"].append(point.p95)
            curves[policy]["finished"].append(point.num_finished)
            wall += point.wall_seconds
            _log(f"{setup.key} rate {rate}: {policy} mean {point.mean:.3f} p95 {point.p95:.3f}")
    slo = setup.slo()
    best = {p: {s: max_rate_within(rates, curves[p][s], slo) for s in ("mean", "p95")}
            for p in POLICIES}
    return {"key": setup.key, "title": setup.title, "rates": list(rates), "slo": slo,
            "num_gpus": setup.num_gpus, "max_num_seqs": setup.max_num_seqs,
            "curves": curves, "max_rate": best, "multiples": _multiples(best),
            "multiple_bounds": {s: {b: _bound(best["fastserve"][s], best[b][s])
                                    for b in ("vllm", "fastserve-fcfs")} for s in ("mean", "p95")},
            "latency_cut": _latency_cut(rates, curves, best), "wall_seconds": wall}


def _latency_cut(rates: Sequence[float], curves: dict[str, dict[str, list[float]]],
                 best: dict[str, dict[str, tuple[float, str]]]) -> dict[str, float]:
    """vLLM's latency over FastServe's at the highest rate vLLM sustains within the SLO."""
    out = {}
    for stat in ("mean", "p95"):
        rate, flag = best["vllm"][stat]
        ours = value_at(rates, curves["fastserve"][stat], rate)
        theirs = value_at(rates, curves["vllm"][stat], rate)
        out[stat] = theirs / ours if flag == "" and ours > 0 else float("nan")
    return out


def _multiples(best: dict[str, dict[str, tuple[float, str]]]) -> dict[str, dict[str, float]]:
    """FastServe's highest rate over each baseline's (NaN where both stay within the SLO
    over the whole sweep); `_bound` says whether a value is a lower or upper bound."""
    out: dict[str, dict[str, float]] = {}
    for stat in ("mean", "p95"):
        fs = best["fastserve"][stat]
        out[stat] = {}
        for base in ("vllm", "fastserve-fcfs"):
            other = best[base][stat]
            both_open = fs[1] == ">=" and other[1] == ">="
            out[stat][base] = float("nan") if both_open or not other[0] else fs[0] / other[0]
    return out


def _bound(fs: tuple[float, str], base: tuple[float, str]) -> str:
    """'>=' if the multiple is a lower bound, '<=' if an upper bound, '' if read off."""
    lower = fs[1] == ">=" or base[1] == "<"
    upper = base[1] == ">=" or fs[1] == "<"
    return "" if lower == upper else (">=" if lower else "<=")


def _fmt_multiple(value: float, bound: str = "") -> str:
    return "-" if not math.isfinite(value) else f"{bound}{value:.2f}x"


def _fmt_rate(value: tuple[float, str]) -> str:
    rate, flag = value
    return f"{flag}{rate:.2f}"


def headline_rows(panels: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for panel in panels:
        for stat, name in (("mean", "average"), ("p95", "p95")):
            best, mult = panel["max_rate"], panel["multiples"][stat]
            fs = best["fastserve"][stat]
            rows.append({
                "setup": panel["title"], "latency": name, "SLO (s/token)": panel["slo"],
                "vllm": _fmt_rate(best["vllm"][stat]),
                "fastserve-fcfs": _fmt_rate(best["fastserve-fcfs"][stat]),
                "fastserve": _fmt_rate(best["fastserve"][stat]),
                "x vllm": _fmt_multiple(mult["vllm"], _bound(fs, best["vllm"][stat])),
                "x fcfs": _fmt_multiple(mult["fastserve-fcfs"],
                                        _bound(fs, best["fastserve-fcfs"][stat])),
                "latency cut at vllm's limit": _fmt_multiple(panel["latency_cut"][stat]),
                "MLFQ's share of the gain": _fmt_share(mlfq_share(mult)),
            })
    return rows


def mlfq_share(multiples: dict[str, float]) -> float:
    """The part of FastServe's gain over vLLM that the MLFQ makes (the rest is the
    engine's swapping, which FastServe-FCFS has too): x vllm = x(fcfs over vllm) * x fcfs,
    so the share is log(x fcfs) / log(x vllm). NaN where either is unknown or there is
    no gain."""
    over_vllm, over_fcfs = multiples["vllm"], multiples["fastserve-fcfs"]
    if not (math.isfinite(over_vllm) and math.isfinite(over_fcfs)) or over_vllm <= 1.0:
        return math.nan
    return math.log(over_fcfs) / math.log(over_vllm)


def _fmt_share(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.0%}"


def kv_memory_section(report: Report, quick: bool, seed: int) -> None:
    setup = setup_named("opt13b-1gpu")
    workload = gamma_burst(150 if quick else 400, rate=8.0, cv=4.0, max_output=20, seed=seed)
    traces, peaks = {}, {}
    for policy in ("fastserve-fcfs", "fastserve"):
        point = run_point(setup.spec(policy, _options(setup, policy)), workload, trace_kv=True)
        traces[policy] = point.kv_trace
        peaks[policy] = max((d + h for _, d, h in point.kv_trace), default=0.0)
    capacity = _device_kv_gb(setup)
    report.section("Fig. 8: KV cache memory under FCFS and MLFQ", (
        f"{setup.title}; Gamma arrivals (8 jobs/s, CV 4), ShareGPT prompts, outputs capped "
        f"at 20 tokens; KV in use on the device plus the host after every step. Peak: FCFS "
        f"{peaks['fastserve-fcfs']:.1f} GB, MLFQ {peaks['fastserve']:.1f} GB "
        f"({peaks['fastserve'] / max(peaks['fastserve-fcfs'], 1e-9):.1f}x; the paper: up to "
        "7x on OPT-2.7B). Preempted jobs keep their KV: MLFQ needs the host tier."))
    report.figure("fig8_kv_memory", plots.kv_memory(traces, capacity), "KV cache memory")
    report.result("fig8", {"peak_gb": peaks, "device_capacity_gb": capacity})


def _device_kv_gb(setup: Setup) -> float:
    cost = setup.cost_model()
    return cost.kv_capacity_tokens(0.9) * cost.kv_bytes_per_token / 1e9


KV_VARIANTS: dict[str, dict[str, Any]] = {
    "proactive (default)": {},
    "proactive, no reserve": {"reserve_max_fraction": 0.0},
    "proactive, reserve for 1 s of arrivals": {"reserve_horizon": 1.0,
                                               "reserve_max_fraction": 0.1},
    "reactive": {"kv_mode": "reactive"},
    "recompute": {"kv_mode": "recompute"},
}


def kv_modes_section(report: Report, quick: bool, seed: int) -> None:
    setup = setup_named("opt13b-1gpu")
    rates = (1.0,) if quick else (0.5, 0.75, 1.0, 1.25, 1.5)
    n = 100 if quick else 500
    curves: dict[str, list[float]] = {k: [] for k in KV_VARIANTS}
    rows = []
    for rate in rates:
        workload = sharegpt_poisson(rate, n, seed)
        for name, extra in KV_VARIANTS.items():
            spec = setup.spec("fastserve", fastserve_options(setup, **extra))
            point: Point = run_point(spec, workload, measure_stalls=True)
            curves[name].append(point.mean)
            rows.append({"rate": rate, "KV management": name, "mean (s/token)": point.mean,
                         "p95 (s/token)": point.p95,
                         "busy time waiting for swaps": f"{100 * point.swap_stall_share:.1f}%"})
            _log(f"kv {name} rate {rate}: mean {point.mean:.3f}")
    report.section("Fig. 15(a): proactive vs reactive swapping vs recompute", (
        f"{setup.title}, ShareGPT, {n} requests per point. 'busy time waiting for swaps' is "
        "the share of step time spent on KV copies the step itself needed (not hidden "
        "behind its forward pass). Paper: proactive beats recompute by 2.7x and reactive "
        "by 1.7x."))
    report.table(rows)
    report.figure("fig15_kv_modes", plots.kv_modes(rates, curves, setup.slo()), "KV modes")
    report.result("kv_modes", {"rates": list(rates), "mean": curves, "rows": rows})


def alpha_section(report: Report, quick: bool, seed: int) -> None:
    setup = setup_named("opt13b-1gpu")
    slo = setup.slo()
    alphas = {"3 s (public code)": 3.0, f"100 x SLO = {100 * slo:.0f} s": 100 * slo,
              f"{ALPHA_SLO_MULTIPLE:g} x SLO = {ALPHA_SLO_MULTIPLE * slo:.0f} s (used)":
              ALPHA_SLO_MULTIPLE * slo, "off": None}
    rates = (1.0,) if quick else (1.0, 1.5)
    rows = []
    for rate in rates:
        workload = sharegpt_poisson(rate, 100 if quick else 600, seed)
        for name, alpha in alphas.items():
            point = run_point(setup.spec("fastserve", {"starve_limit": alpha}), workload)
            rows.append({"rate": rate, "alpha": name, "mean (s/token)": point.mean,
                         "p95 (s/token)": point.p95})
    report.section("Starvation limit alpha", (
        "The paper tunes alpha from the SLO without giving the rule; FastServe's code uses "
        "3 s. Every promotion to Q1 brings a deep job's KV back for a few iterations, so a "
        "short alpha under load turns into swap traffic."))
    report.table(rows)
    report.result("alpha", rows)


LONG_PROMPTS = "uniform:20000:80000:300:700"
LONG_CONTEXT = 131_072


def memory_bound_section(report: Report, quick: bool, seed: int) -> None:
    """Issue 14.5's reproduction: prompts of 20k-80k tokens on one A100-40G with vLLM's
    default 4 GiB of host KV (less than one prompt): swapping rarely fits, so a job that
    loses its place loses its KV."""
    n = 15 if quick else 30
    workload = build_workload(WorkloadConfig(kind="poisson", rate=0.2, num_requests=n,
                                             lengths=LONG_PROMPTS, max_context=LONG_CONTEXT,
                                             seed=seed))
    config = SchedulerConfig(max_model_len=LONG_CONTEXT, max_num_batched_tokens=LONG_CONTEXT)
    rows = []
    for policy in POLICIES:
        spec = ClusterSpec(model="llama-3.1-8b", hardware="a100-40g", scheduler=config,
                           policy="vllm-v0" if policy == "vllm" else policy)
        run = simulate(spec, workload)
        preemptions = [len(r.timeline.preemption_times) for r in run.requests]
        recomputes = sum(r.timeline.num_recomputes for r in run.requests)
        rows.append({"policy": policy, "finished": run.summary.num_finished,
                     "makespan (s)": round(run.report.end_time, 1),
                     "mean TTFT (s)": round(run.summary.ttft.mean, 1),
                     "preemptions / request": round(sum(preemptions) / n, 2),
                     "max preemptions": max(preemptions), "recomputes": recomputes})
        _log(f"memory-bound {policy}: makespan {run.report.end_time:.1f}")
    report.section("Memory-bound long prompts (not in the paper)", (
        f"Llama-3.1-8B on 1 x A100-40G, {n} requests, prompts 20k-80k tokens, outputs "
        "300-700, Poisson 0.2 jobs/s, 4 GiB of host KV (less than one prompt). FastServe "
        "keeps a job on the device when the host cannot take its KV instead of dropping "
        "it for a job ahead in the MLFQ: before that rule, demotion and starvation "
        "promotion handed the device back and forth between long jobs, recomputing their "
        "KV every turn (~60 preemptions per request, makespan ~40x FCFS)."))
    report.table(rows)
    report.result("memory_bound", rows)


def setup_named(key: str) -> Setup:
    return next(s for s in SETUPS if s.key == key)


def batch_size_section(report: Report, seed: int) -> None:
    setup = setup_named("llama70b-4gpu")
    rows = []
    workload = sharegpt_poisson(4.0, 600, seed)
    for seqs in (32, 64, 256):
        for policy in ("vllm", "fastserve"):
            spec = setup.spec(policy, _options(setup, policy))
            spec = replace(spec, scheduler=replace(spec.scheduler, max_num_seqs=seqs))
            point = run_point(spec, workload)
            rows.append({"max batch (seqs)": seqs, "policy": policy,
                         "mean (s/token)": point.mean, "p95 (s/token)": point.p95})
    report.section("Batch size (the paper uses one size for every system, unstated)", (
        f"{setup.title} at 4 jobs/s. With a GQA 70B model the KV cache holds ~1000 ShareGPT "
        "jobs, so with vLLM's 256 every job is in every batch and no scheduler can reorder "
        "anything: all latency comes from batch composition. Bounded batches queue jobs, "
        "which is where skip-join MLFQ pays off."))
    report.table(rows)
    report.result("batch_size", rows)


def run(ctx: ExperimentContext) -> Report:
    report = Report(ctx.output_dir, "FastServe: skip-join MLFQ with proactive KV swapping")
    n = 120 if ctx.quick else 1000
    setups = [s for s in SETUPS if (s.quick_rates if ctx.quick else s.rates)]
    panels = [sweep(s, s.quick_rates if ctx.quick else s.rates, n, ctx.seed) for s in setups]
    report.section("Setup", (
        f"Simulated A100s running the real scheduler; ShareGPT lengths (prompt + output "
        f"<= 2048), Poisson arrivals, {n} requests per point, seed {ctx.seed}; max 2048 "
        "batched tokens; fastserve and fastserve-fcfs swap over PCIe 4.0 on a copy stream "
        f"overlapped with compute (96 GiB host KV per GPU); vllm recomputes. fastserve: "
        f"base quantum = the model's minimum iteration time, ratio 2, 16 queues, alpha = "
        f"{ALPHA_SLO_MULTIPLE:g} x SLO, proactive swapping with a burst reserve."))
    report.section("Highest rate within the SLO, and multiples (Fig. 11 / Fig. 12)", (
        "Rates in jobs/s, interpolated on the curves; '>=' = never crossed in the sweep "
        "(a lower bound). 'x vllm' / 'x fcfs': FastServe's highest rate over theirs. "
        "'MLFQ's share of the gain': log(x fcfs) / log(x vllm), the part of the gain over "
        "vLLM that skip-join MLFQ makes beyond FastServe-FCFS (same engine and swapping). "
        "'latency cut at vllm's limit': at the highest rate vLLM sustains, vLLM's latency "
        "over FastServe's. The skewed mix is synthetic (see fastserve_runs.skewed_mix)."))
    report.table(headline_rows(panels))
    report.section("The paper's numbers, for comparison")
    report.table(paper_rows())
    report.figure("fig11_average_latency", plots.latency_curves(panels, "mean",
                  "Latency (s/token)"), "Average per-token latency (Fig. 11)")
    report.figure("fig12_p95_latency", plots.latency_curves(panels, "p95",
                  "P95 latency (s/token)"), "P95 per-token latency (Fig. 12)")
    report.result("setups", panels)
    kv_memory_section(report, ctx.quick, ctx.seed)
    kv_modes_section(report, ctx.quick, ctx.seed)
    alpha_section(report, ctx.quick, ctx.seed)
    memory_bound_section(report, ctx.quick, ctx.seed)
    if not ctx.quick:
        batch_size_section(report, ctx.seed)
    report.section("Differences from the paper, and why", differences(panels))
    report.result("quick", ctx.quick)
    return report
