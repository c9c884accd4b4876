"""`andante experiment qlm`: QLM's evaluation (§8, A.1-A.3) on simulated GPUs.

Design note: QLM §8. Fig. 8/9: W_A (multi-model) throughput and SLO attainment against
the share of requests for tail models and of latency-sensitive requests; Fig. 11/12: the
same for W_B (single model); Fig. 10/13: the ablation, each serving operation removed in
turn; Fig. 14: hardware heterogeneity (A10 + A100 mixes); W_C mega prompts; W_A with
arrivals from the shared Azure trace beside Poisson; Fig. 16: queue size (SLO attainment
against the mean queue, and the queue over time per system); Fig. 17: the
estimator's accuracy (R²); Fig. 18: the group size δ; Fig. 19: the planner's overhead
(benchmarks/qlm_planner.py). Every system runs the same simulated engine, so the
multiples measure queue management alone. Numbers from the paper are quoted beside ours.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from andante.bench.report import Report
from andante.sim import ClusterSpec
from andante.workload.spec import RequestSpec
from experiments import qlm_plots as plots
from experiments import qlm_text as text
from experiments.qlm_runs import (
    ARRIVALS,
    FULL_MODELS,
    MAX_CONTEXT,
    QUICK_MODELS,
    SYSTEMS,
    base_spec,
    estimator_accuracy,
    mixed_hardware,
    run_point,
    system_spec,
    w_a,
    w_b,
    w_c,
    w_evict,
)
from experiments.registry import ExperimentContext

METRICS = (("slo_attainment", "SLO attainment"), ("throughput", "Throughput (req/s)"))
# The knobs removed one at a time (Fig. 10 / 13): qlm router options, or the engines'.
ABLATION: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("QLM (all operations)", {}, {}),
    ("- request pulling", {"pull": False}, {}),
    ("- load balancing", {"load_balance": False}, {}),
    ("- model warm start", {"warm_start": False}, {"host_memory_gib": 0.0}),
    ("- plan generator (EDF)", {"plan": False}, {}),
    ("- request eviction", {"evict": False}, {}),
    ("- GPU-CPU state swap", {"state_swap": False}, {"auto_preemption": False}),
)
PAPER = (
    {"figure": "Fig. 8-9, 11-12", "claim": "SLO attainment over the baselines",
     "paper": "+40-90% (vLLM), +50-90% (SHEPHERD)"},
    {"figure": "Fig. 8", "claim": "W_A throughput", "paper": "up to 3-4x"},
    {"figure": "Fig. 11", "claim": "W_B throughput", "paper": "+20% (vLLM, EDF), +50% (SHEPHERD)"},
    {"figure": "Fig. 10", "claim": "model warm start, multi-model throughput",
     "paper": "+300% (about 3x)"},
    {"figure": "Fig. 13", "claim": "request eviction, single-model SLO attainment",
     "paper": "+80%"},
    {"figure": "Fig. 14", "claim": "heterogeneity: QLM over random assignment",
     "paper": "2-5x larger gain at 20-50% A10"},
    {"figure": "Fig. 17 / §2.4", "claim": "estimator R² (waiting time)", "paper": "0.99"},
)


def _log(message: str) -> None:
    print(f"[qlm] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Scale:
    """Sizes of one run of the experiment (quick: the CI smoke run)."""

    num_requests: int
    num_instances: int
    models: tuple[str, ...]
    rate: float  # requests/s of W_A / W_C
    rate_b: float  # requests/s of W_B
    shares: tuple[float, ...]
    seed: int

    @classmethod
    def of(cls, ctx: ExperimentContext) -> Scale:
        if ctx.quick:
            return cls(160, 2, QUICK_MODELS, 3.0, 16.0, (0.2, 0.6), ctx.seed)
        return cls(600, 4, FULL_MODELS, 6.0, 32.0, (0.1, 0.3, 0.5, 0.7, 0.9), ctx.seed)

    def cluster(self, hardware: str = "a100-80g") -> ClusterSpec:
        return base_spec(self.models, self.num_instances, hardware)


def _sweep(scale: Scale, xs: Sequence[float], spec: ClusterSpec,
           make: Callable[[float], list[RequestSpec]]) -> dict[str, Any]:
    curves: dict[str, dict[str, list[float]]] = {
        s: {"slo_attainment": [], "throughput": [], "swaps": [], "planner": [],
            "measured": []} for s in SYSTEMS}
    r2: list[float | None] = []
    for x in xs:
        workload = make(x)
        for system in SYSTEMS:
            point = run_point(system_spec(spec, system), workload)
            curves[system]["slo_attainment"].append(point.slo_attainment)
            curves[system]["throughput"].append(point.throughput)
            curves[system]["swaps"].append(point.num_swaps)
            curves[system]["planner"].append(point.planner)
            curves[system]["measured"].append(point.measured())
            if system == "qlm":
                r2.append(point.estimator_r2)
    return {"xs": list(xs), "curves": curves, "estimator_r2": r2}


def _figure(report: Report, name: str, fig: Any, caption: str) -> None:
    report.figure(name, fig, caption)
    plots.close(fig)


def _multiples(panel: dict[str, Any]) -> list[dict[str, Any]]:
    """QLM over each baseline, at every point of the sweep: SLO gain, throughput ratio."""
    rows = []
    qlm = panel["curves"]["qlm"]
    for system in SYSTEMS[1:]:
        other = panel["curves"][system]
        for i, x in enumerate(panel["xs"]):
            rows.append({"x": x, "baseline": system,
                         "SLO gain (points)": qlm["slo_attainment"][i] - other["slo_attainment"][i],
                         "throughput x": qlm["throughput"][i] / max(other["throughput"][i], 1e-9)})
    return rows


def _sweep_section(report: Report, name: str, title: str, xlabel: str,
                   panel: dict[str, Any], text: str) -> None:
    report.section(title, text)
    rows = [{xlabel: x, "system": s, "SLO attainment": c["slo_attainment"][i],
             "throughput (req/s)": c["throughput"][i], "model swaps": c["swaps"][i]}
            for s, c in panel["curves"].items() for i, x in enumerate(panel["xs"])]
    report.table(rows)
    report.text("QLM's multiples over each baseline:")
    report.table(_multiples(panel))
    _figure(report, name, plots.sweep(panel["xs"], panel["curves"], xlabel, METRICS), title)
    report.result(name, panel)


def workload_sections(report: Report, scale: Scale) -> dict[str, Any]:
    n, seed, models = scale.num_requests, scale.seed, scale.models
    multi, single = scale.cluster(), base_spec(models[:1], scale.num_instances)
    tail = _sweep(scale, scale.shares, multi,
                  lambda x: w_a(models, x, 0.2, scale.rate, n, seed))
    _sweep_section(report, "fig8_wa_tail_share", "W_A: share of tail-model requests (Fig. 8)",
                   "tail share", tail, f"{len(models)} models ({models[0]} popular, the rest "
                   f"tail) on {scale.num_instances} x A100-80G; 20% latency-sensitive.")
    latency = _sweep(scale, scale.shares, multi,
                     lambda x: w_a(models, 0.6, x, scale.rate, n, seed))
    _sweep_section(report, "fig9_wa_latency_share",
                   "W_A: share of latency-sensitive requests (Fig. 9)", "latency share",
                   latency, "Tail models get 60% of the requests.")
    single_panel = _sweep(scale, scale.shares, single,
                          lambda x: w_b(models[0], x, scale.rate_b, n, seed))
    _sweep_section(report, "fig12_wb_latency_share",
                   "W_B: single model, share of latency-sensitive requests (Fig. 11-12)",
                   "latency share", single_panel, f"{models[0]} on every instance.")
    return {"tail": tail, "latency": latency, "single": single_panel}


def azure_section(report: Report, scale: Scale) -> dict[str, Any]:
    """W_A's tail-share sweep with arrivals from the Azure conversation trace."""
    models, n, seed = scale.models, scale.num_requests, scale.seed
    panel = _sweep(scale, scale.shares, scale.cluster(),
                   lambda x: w_a(models, x, 0.2, scale.rate, n, seed, ARRIVALS[1]))
    _sweep_section(report, "fig8_wa_tail_share_azure",
                   "W_A with Azure-trace arrivals: share of tail-model requests (Fig. 8)",
                   "tail share", panel, f"As Fig. 8, but the arrivals are the first {n} of "
                   "the shared Azure 2023 conversation trace, replayed at the sweep's mean "
                   f"rate ({scale.rate:g} req/s): its bursts kept, its rate rescaled.")
    return panel


def queue_section(report: Report, scale: Scale) -> None:
    """Fig. 16: W_B at rising rates (longer queues); SLO attainment against the mean queue
    size, and the queue over time per system at the highest rate."""
    factors = (1.0, 2.0, 4.0) if len(scale.shares) < 5 else (0.5, 1.0, 2.0, 3.0, 4.0)
    spec = base_spec(scale.models[:1], scale.num_instances)
    rows, series = [], {}
    for factor in factors:
        workload = w_b(scale.models[0], 0.3, factor * scale.rate_b, scale.num_requests,
                       scale.seed)
        for system in SYSTEMS:
            point = run_point(system_spec(spec, system), workload)
            rows.append({"rate (req/s)": factor * scale.rate_b, "system": system,
                         "mean queue": point.mean_queue, **point.row()})
            series[system] = point.queue  # the last (highest) rate's is kept
    report.section("Queue size (Fig. 16)", (
        "W_B (30% latency-sensitive) at rising arrival rates: the queue is the number of "
        "requests arrived and not yet scheduled (global queue plus the engines' waiting "
        "queues), time-averaged over the run. Left: SLO attainment against that mean "
        "queue size, per system (the paper's Fig. 16); right: the queue over time at the "
        "highest rate."))
    report.table(rows)
    _figure(report, "fig16_queue_size", plots.queue_size(rows, series),
            "SLO attainment vs queue size; queue size over time")
    report.result("fig16_queue_size", {"rows": rows, "series": series})


def ablation_section(report: Report, scale: Scale, name: str, spec: ClusterSpec,
                     workload: list[RequestSpec], title: str) -> list[dict[str, Any]]:
    rows = []
    for label, router_options, engine in ABLATION:
        point = run_point(dataclasses.replace(system_spec(spec, "qlm", **router_options),
                                              **engine), workload)
        rows.append({"variant": label, **point.row(), "planner": point.planner,
                     "measured": point.measured()})
    report.section(title, "Each serving operation removed in turn (QLM router options "
                   "`pull`, `load_balance`, `warm_start`, `plan`; eviction = the `edf` "
                   "engine policy preempting for urgent pulled requests, replaced by "
                   "`vllm`; state swap = swap-or-recompute by cost, replaced by recompute; "
                   "warm start = the next model read into host memory ahead of need and "
                   "host memory keeping models warm, replaced by no host memory for weights: every "
                   "swap is a cold start from disk).")
    report.table(rows, ["variant", "SLO attainment", "throughput (req/s)", "model swaps",
                        "planner"])
    _figure(report, name, plots.bars(rows, "variant", (("SLO attainment", "SLO attainment"),
                                                       ("throughput (req/s)", "req/s"))), title)
    report.result(name, rows)
    return rows


EVICTION_VARIANTS = tuple(a for a in ABLATION if a[0] in (
    "QLM (all operations)", "- request eviction", "- GPU-CPU state swap"))


def eviction_section(report: Report, scale: Scale) -> list[dict[str, Any]]:
    """LSOs 2-3 where they must act: latency-sensitive requests behind a batch that
    fills the KV cache (experiments.qlm_runs.w_evict), with and without each."""
    spec = base_spec(scale.models[:1], scale.num_instances)
    slots = spec.scheduler.max_num_seqs
    latency_rate = 0.3 * scale.rate_b  # W_B's latency-sensitive arrivals (30%)
    workload = w_evict(scale.models[0], scale.num_instances, slots, latency_rate,
                       scale.num_requests // 4, scale.seed)
    rows = []
    for label, router_options, engine in EVICTION_VARIANTS:
        point = run_point(dataclasses.replace(system_spec(spec, "qlm", **router_options),
                                              **engine), workload)
        classes = {f"SLO attainment ({d:g} s, {n} requests)": a for d, a, n in point.by_slo}
        rows.append({"variant": label, **point.row(), **classes,
                     "evictions": point.counters.get("num_evictions", 0),
                     "state swaps": point.counters.get("num_state_swaps", 0),
                     "by_slo": [list(c) for c in point.by_slo], "measured": point.measured()})
    report.section("Eviction and state swap behind a saturated batch (Fig. 13's mechanism)", (
        f"{scale.models[0]} on {scale.num_instances} instances: at t = 0, batch-SLO "
        f"requests with long outputs (256 in, 2,000 out), {slots} per instance (every "
        f"batch slot); from t = 5 s, {scale.num_requests // 4} latency-sensitive ShareGPT "
        f"requests at {latency_rate:g} req/s (W_B's 30%). Without eviction they wait for "
        "a slot, freed only as the long requests finish; with it the agent removes long "
        "requests that can afford the wait (recompute or state swap, per request by "
        "Insight #2). Evictions and state swaps are the agents' counts in each run."))
    report.table(rows, ["variant", "SLO attainment", *[k for k in rows[0]
                                                       if k.startswith("SLO attainment (")],
                        "throughput (req/s)", "evictions", "state swaps"])
    report.result("eviction_saturated", rows)
    return rows


def heterogeneity_section(report: Report, scale: Scale) -> None:
    workload = w_a(scale.models, 0.6, 0.2, scale.rate, scale.num_requests, scale.seed)
    rows = []
    for num_a10 in range(scale.num_instances + 1):
        spec = mixed_hardware(scale.cluster(), num_a10)
        for label, system, options in (("QLM", "qlm", {}),
                                       ("QLM, static assignment", "qlm",
                                        {"load_balance": False}),
                                       ("vLLM round-robin", "vllm", {})):
            point = run_point(system_spec(spec, system, **options), workload)
            rows.append({"A10 share": num_a10 / scale.num_instances, "system": label,
                         **point.row(), "requests refused": scale.num_requests
                         - point.num_finished})
    report.section("Hardware heterogeneity: A10-24G + A100-80G (Fig. 14)", (
        "W_A on mixes of A10 and A100 instances. Models whose weights and KV do not fit "
        "an A10 are served only by the A100s; with no A100 left they are refused. 'static "
        "assignment' is the paper's comparison: QLM per instance, groups placed by model "
        "instead of by the estimator."))
    report.table(rows)
    report.result("fig14_heterogeneity", rows)


def mega_section(report: Report, scale: Scale) -> None:
    shares = (0.0, 0.02, 0.05) if len(scale.shares) < 5 else (0.0, 0.01, 0.02, 0.05, 0.1)
    panel = _sweep(scale, shares, scale.cluster(),
                   lambda x: w_c(scale.models, x, scale.rate, scale.num_requests, scale.seed))
    _sweep_section(report, "wc_mega_prompts", "W_C: mega prompts (3,000 in + 1,000 out)",
                   "mega-prompt share", panel, "W_A (60% tail, 20% latency-sensitive) with "
                   "a share of its requests turned into mega prompts.")


def delta_section(report: Report, scale: Scale) -> list[dict[str, Any]]:
    workload = w_a(scale.models, 0.6, 0.2, 3 * scale.rate, scale.num_requests, scale.seed)
    rows = []
    for delta in (1.0, 4.0, 16.0) if len(scale.shares) < 5 else (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        point = run_point(system_spec(scale.cluster(), "qlm", delta=delta), workload)
        rows.append({"delta": delta, **point.row(), "planner": point.planner,
                     "measured": point.measured()})
    report.section("Group size δ (Fig. 18)", "W_A at 3x the sweeps' rate (a longer queue). "
                   "Groups are capped at δ x the measured average batch. Small groups: "
                   "finer ordering, more model switches and a larger program; large "
                   "groups: coarser ordering (head-of-line blocking inside a group).")
    report.table(rows, ["delta", "SLO attainment", "throughput (req/s)", "model swaps",
                        "planner"])
    report.result("fig18_delta", rows)
    return rows


def planner_section(report: Report, quick: bool) -> None:
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "qlm_planner.py"
    groups, insts = (["10", "50", "100"], ["2", "8"]) if quick else (
        ["10", "50", "100", "200"], ["2", "8", "32"])
    out = subprocess.run([sys.executable, str(script), "--groups", *groups, "--instances",
                          *insts, "--repeats", "1" if quick else "3"],
                         capture_output=True, text=True, check=True)
    results = json.loads(out.stdout)["results"]
    report.section("Planner overhead (Fig. 19)", "benchmarks/qlm_planner.py: median wall "
                   "time of one plan (MILP over the 12 most urgent groups, the rest by EDF; "
                   "HiGHS limited by a deterministic work budget, so plans are reproducible). "
                   "Target: <= 100 ms for 100 groups.")
    report.table([{k: r[k] for k in ("groups", "instances", "solve_ms", "build_ms", "status",
                                     "fallback", "source")} for r in results])
    report.result("fig19_planner", results)


def estimator_section(report: Report, panels: dict[str, Any], scale: Scale
                      ) -> dict[str, Any]:
    burst = estimator_accuracy(150 if len(scale.shares) < 5 else 400, scale.seed)
    in_runs = [v for p in panels.values() for v in p["estimator_r2"] if v is not None]
    report.section("Estimator accuracy (Fig. 17; paper: R² 0.99 for waiting time)", (
        "W_B (batch SLO only) in two bursts on one Mistral-7B instance (at most 32 "
        "running, so a queue "
        "forms); the first burst trains the estimator (output lengths, measured Θ), the "
        "second arrives at one instant and is measured: R² of each request's first "
        "predicted start time (W_q, eq. 2) "
        "and completion time (its group's, eq. 5) against the observed ones. Below it, "
        "the R² of first-predicted completion (from arrival) in QLM's W_A/W_B runs."))
    report.table([{"setting": "W_B bursts", **burst},
                  {"setting": "W_A/W_B sweeps (completion)",
                   "num_requests": len(in_runs),
                   "r2_completion": min(in_runs) if in_runs else float("nan")}])
    report.result("fig17_estimator", {"bursts": burst, "sweeps": in_runs})
    return burst


def headline_section(report: Report, scale: Scale, panels: dict[str, Any],
                     ablations: tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]],
                     delta: Sequence[dict[str, Any]], burst: dict[str, Any],
                     eviction: Sequence[dict[str, Any]]) -> None:
    """Every reproduced row beside the paper's value, and why they differ, computed from
    what the runs measured (experiments.qlm_text)."""
    n = scale.num_instances
    wa, wb = ablations
    rows = [*text.multi_model_rows(panels["tail"], "W_A (tail share)", n),
            *text.multi_model_rows(panels["latency"], "W_A (latency share)", n),
            *text.multi_model_rows(panels["azure"], "W_A (Azure arrivals)", n),
            *text.single_model_rows(panels["single"]),
            *text.ablation_rows(wa, "W_A", text.PAPER_ABLATION_WA, n),
            *text.ablation_rows(wb, "W_B", text.PAPER_ABLATION_WB, n),
            *text.eviction_rows(eviction),
            text.warm_row(wa, n), *text.delta_rows(delta), text.estimator_row(burst)]
    planners = [p for panel in panels.values() for p in panel["curves"]["qlm"]["planner"]]
    planners += [r["planner"] for r in (*wa, *wb, *delta)]
    planners += [r["measured"]["planner"] for r in eviction]
    rows.append(text.planner_row(planners))
    report.section("Our figures beside the paper's", (
        "Each row: ours (QLM minus the baseline in points of SLO attainment, or a "
        "throughput ratio, over the sweep), the paper's, and the measurements of this run "
        "that explain the difference."))
    report.table(rows)
    report.result("headline", rows)


def run(ctx: ExperimentContext) -> Report:
    report = Report(ctx.output_dir, "QLM: queue management for multi-model LLM serving")
    scale = Scale.of(ctx)
    report.section("Setup", (
        f"Simulated instances running the real engine; ShareGPT lengths (prompt + output "
        f"<= {MAX_CONTEXT}), Poisson arrivals (and, in one section, the Azure trace's), "
        f"{scale.num_requests} requests per point, seed "
        f"{scale.seed}. SLOs (end to end): latency-sensitive 20 s, batch 300 s. Systems: "
        "QLM (qlm router, edf engines), vLLM (round-robin, FCFS), EDF (round-robin, EDF "
        "engines), SHEPHERD (static model placement, deadline-ordered static batches). "
        "Model swaps load weights over PCIe (warm, 25 GB/s) or from NVMe then PCIe (cold, "
        "7 GB/s); KV is flushed and the evicted requests recomputed."))
    report.section("The paper's figures")
    report.table(PAPER)
    _log("workload sweeps")
    panels = workload_sections(report, scale)
    _log("Azure-trace arrivals, queue size")
    panels["azure"] = azure_section(report, scale)
    queue_section(report, scale)
    _log("ablations")
    ablation = ablation_section(report, scale, "fig10_ablation_wa", scale.cluster(),
                     w_a(scale.models, 0.6, 0.2, scale.rate, scale.num_requests, scale.seed),
                     "Ablation, W_A multi-model (Fig. 10)")
    ablation_wb = ablation_section(report, scale, "fig13_ablation_wb",
                     base_spec(scale.models[:1], scale.num_instances),
                     w_b(scale.models[0], 0.3, scale.rate_b, scale.num_requests, scale.seed),
                     "Ablation, W_B single model (Fig. 13)")
    eviction = eviction_section(report, scale)
    _log("heterogeneity, mega prompts, delta, planner")
    heterogeneity_section(report, scale)
    mega_section(report, scale)
    delta = delta_section(report, scale)
    burst = estimator_section(report, panels, scale)
    headline_section(report, scale, panels, (ablation, ablation_wb), delta, burst, eviction)
    planner_section(report, ctx.quick)
    report.result("quick", ctx.quick)
    return report
