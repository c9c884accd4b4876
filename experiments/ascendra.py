"""`andante experiment ascendra`: Ascendra's evaluation (§8) on simulated A100s.

Design note: Ascendra §8.2 (Fig. 9: goodput against the Poisson arrival rate, and
against the SLO scale at a fixed rate), §8.6 (Fig. 12: ten minutes slightly above
capacity with late requests dropped), §8.7 (Fig. 13: 2 LP + 1 HP against 1 LP + 2 HP),
and §5.1 (the performance model refitted online). Three A100-80G instances per system:
vLLM and Sarathi-Serve run three identical instances behind round robin; Ascendra two
LP and one HP instance behind its router. Every system runs on the same simulated
engine, so the differences measure scheduling alone (see the report's last section).
Arrival rates are multiples of the vLLM cluster's saturated throughput (everything
queued at once), so both setups sweep the same region around capacity.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from andante.bench.report import Report
from experiments import ascendra_plots as plots
from experiments import ascendra_text as text
from experiments.ascendra_runs import (
    Job,
    Outcome,
    flood_capacity,
    perf_model_trace,
    rate_at_target,
    run_jobs,
)
from experiments.ascendra_setup import (
    ASCENDRA,
    ASCENDRA_1L2H,
    SARATHI,
    SETUPS,
    SYSTEMS,
    VLLM,
    Setup,
    System,
)
from experiments.registry import ExperimentContext

FULL = {"factors": (0.6, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.45), "n": 2000,
        "scales": (0.25, 0.5, 0.75, 1.0, 1.5, 2.0), "overload_s": 600.0, "perf_steps": 3000}
QUICK = {"factors": (0.8, 1.1, 1.3), "n": 250, "scales": (0.5, 1.0, 2.0),
         "overload_s": 60.0, "perf_steps": 600}
# x the vLLM cluster's saturated throughput: "slightly above capacity", and well above it
OVERLOAD_FACTORS = (1.15, 1.45)
ABLATIONS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("EDF (default)", {}, {}),
    ("SJF", {"value": "sjf"}, {}),
    ("FCFS", {"value": "fcfs"}, {}),
    ("LJF", {"value": "ljf"}, {}),
    ("no elastic batch on HP", {}, {"elastic": False}),
    ("HP decodes wait for prefills (vLLM v0)", {}, {"mixed": False}),
    ("no offload", {"offload": False}, {}),
)


def _log(message: str) -> None:
    print(f"[ascendra] {message}", file=sys.stderr, flush=True)


def _goodputs(out: dict[tuple[Any, ...], Outcome], setup: Setup, system: System,
              rates: Sequence[float], scale: float = 1.0) -> list[float]:
    return [out[(setup.key, system.key, r, scale, False, 3)].goodput for r in rates]


def sweep_section(report: Report, cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """Fig. 9, top row: goodput against the arrival rate; the rate at 90% goodput."""
    capacities = {s.key: flood_capacity(s, seed=seed) for s in SETUPS}
    grid = {s.key: [round(capacities[s.key] * f, 2) for f in cfg["factors"]] for s in SETUPS}
    jobs = [Job(s, system, r, cfg["n"], seed) for s in SETUPS for system in SYSTEMS
            for r in grid[s.key]]
    jobs += [Job(SETUPS[0], ASCENDRA_1L2H, r, cfg["n"], seed) for r in grid[SETUPS[0].key]]
    _log(f"goodput sweep: {len(jobs)} simulations")
    out = run_jobs(jobs)
    panels: list[dict[str, Any]] = []
    for setup in SETUPS:
        rates = grid[setup.key]
        systems = [*SYSTEMS, ASCENDRA_1L2H] if setup is SETUPS[0] else list(SYSTEMS)
        goodput = {sys_.key: _goodputs(out, setup, sys_, rates) for sys_ in systems}
        at90 = {k: rate_at_target(rates, g) for k, g in goodput.items()}
        counters = {k: [out[(setup.key, k, r, 1.0, False, 3)].counters for r in rates]
                    for k in goodput}
        panels.append({"key": setup.key, "title": setup.title, "rates": rates,
                       "capacity": capacities[setup.key], "goodput": goodput,
                       "rate_at_90": at90, "counters": counters})
    report.section("Goodput against the arrival rate (Fig. 9, top row)", text.SWEEP)
    report.text("")
    report.table(text.sweep_rows(panels))
    report.figure("fig9_goodput_vs_qps", plots.goodput_curves(
        [{**p, "goodput": {k: v for k, v in p["goodput"].items() if k != "ascendra-1l2h"}}
         for p in panels], "rates", "Arrival rate (requests/s)"), "Goodput vs arrival rate")
    report.text("")
    report.table(text.headline_rows(panels))
    report.result("sweep", panels)
    return {p["key"]: p for p in panels}


def slo_scale_section(report: Report, cfg: dict[str, Any], panels: dict[str, Any],
                      seed: int) -> None:
    """Fig. 9, bottom row: goodput at a fixed rate under stricter and looser SLOs."""
    rates = {k: _scale_rate(p) for k, p in panels.items()}
    jobs = [Job(s, system, rates[s.key], cfg["n"], seed, slo_scale=scale)
            for s in SETUPS for system in SYSTEMS for scale in cfg["scales"]]
    _log(f"SLO scale: {len(jobs)} simulations")
    out = run_jobs(jobs)
    out_panels = []
    for setup in SETUPS:
        rate = rates[setup.key]
        goodput = {sys_.key: [out[(setup.key, sys_.key, rate, sc, False, 3)].goodput
                              for sc in cfg["scales"]] for sys_ in SYSTEMS}
        out_panels.append({"key": setup.key, "title": f"{setup.title}, {rate:.2f} req/s",
                           "scales": list(cfg["scales"]), "rate": rate, "goodput": goodput})
    report.section("Goodput against the SLO scale (Fig. 9, bottom row)", text.SLO_SCALE)
    report.text("")
    report.table(text.scale_rows(out_panels))
    report.figure("fig9_goodput_vs_slo_scale", plots.goodput_curves(
        out_panels, "scales", "SLO scale (x the TTFT and TBT SLOs)"), "Goodput vs SLO scale")
    report.result("slo_scale", out_panels)


def _scale_rate(panel: dict[str, Any]) -> float:
    """Where Ascendra's goodput is just above 90% (the paper's choice)."""
    above = [r for r, g in zip(panel["rates"], panel["goodput"]["ascendra"], strict=True)
             if g >= 0.9]
    return max(above) if above else panel["rates"][0]


def pools_section(report: Report, panels: dict[str, Any]) -> None:
    """Fig. 13 (right): 2 LP + 1 HP against 1 LP + 2 HP on ShareGPT."""
    panel = panels[SETUPS[0].key]
    rows = [{"rate (req/s)": r, "2L1H": g2, "1L2H": g1} for r, g2, g1 in zip(
        panel["rates"], panel["goodput"]["ascendra"], panel["goodput"]["ascendra-1l2h"],
        strict=True)]
    at = panel["rate_at_90"]
    report.section("Two LP + one HP against one LP + two HP (Fig. 13, right)", text.pools(
        at["ascendra"], at["ascendra-1l2h"]))
    report.text("")
    report.table(rows)
    report.figure("fig13_pools", plots.goodput_curves([{
        "title": panel["title"], "rates": panel["rates"],
        "goodput": {k: panel["goodput"][k] for k in ("ascendra", "ascendra-1l2h", "vllm")},
    }], "rates", "Arrival rate (requests/s)"), "2L1H vs 1L2H")
    report.result("pools", {"rate_at_90": {k: at[k] for k in ("ascendra", "ascendra-1l2h")}})


def overload_section(report: Report, cfg: dict[str, Any], panels: dict[str, Any],
                     seed: int) -> None:
    """Fig. 12: minutes above capacity; requests past their TTFT SLO are dropped."""
    setup = SETUPS[0]
    systems = (VLLM, SARATHI, ASCENDRA)
    rates = [round(f * panels[setup.key]["capacity"], 2) for f in OVERLOAD_FACTORS]
    jobs = [Job(setup, s, rate, None, seed, duration=cfg["overload_s"], drop_late=True)
            for rate in rates for s in systems]
    _log(f"overload: {len(jobs)} simulations of {cfg['overload_s']:.0f} s")
    out = run_jobs(jobs)
    runs = []
    for factor, rate in zip(OVERLOAD_FACTORS, rates, strict=True):
        counts = {}
        for s in systems:
            o = out[(setup.key, s.key, rate, 1.0, True, 3)]
            counts[s.key] = {"requests": o.num_requests, "good": o.num_good,
                             "violated": o.num_violated, "dropped": o.num_dropped}
        runs.append({"factor": factor, "rate": rate, "counts": counts})
    report.section("Serving above capacity with dropping (Fig. 12)", text.overload(
        setup, cfg["overload_s"], runs))
    report.text("")
    report.table([{"x capacity": r["factor"], "rate": r["rate"], "system": k, **v}
                  for r in runs for k, v in r["counts"].items()])
    report.figure("fig12_overload", plots.overload_bars(runs[0]["counts"]),
                  f"Overload with dropping, {rates[0]} req/s")
    report.result("overload", {"seconds": cfg["overload_s"], "runs": runs})


def ablation_section(report: Report, cfg: dict[str, Any], panels: dict[str, Any],
                     seed: int) -> None:
    """Fig. 11: value functions and the elastic batch; plus the HP's decode mode."""
    setup = SETUPS[0]
    rates = [r for r, f in zip(panels[setup.key]["rates"], cfg["factors"], strict=True)
             if f >= 1.0][:3]
    variants = [dataclasses.replace(ASCENDRA, key=f"ablation-{i}", lp_options=lp,
                                    hp_options=hp) for i, (_, lp, hp) in enumerate(ABLATIONS)]
    out = run_jobs([Job(setup, v, r, cfg["n"], seed) for v in variants for r in rates])
    rows = [{"variant": name, **{f"{r} req/s": out[(setup.key, v.key, r, 1.0, False, 3)]
                                  .goodput for r in rates}}
            for (name, _, _), v in zip(ABLATIONS, variants, strict=True)]
    report.section("Ablations (Fig. 11 and design choices)", text.ABLATIONS)
    report.text("")
    report.table(rows)
    report.result("ablations", rows)


def perf_section(report: Report, cfg: dict[str, Any], seed: int) -> None:
    trace = perf_model_trace(SETUPS[0], cfg["perf_steps"], seed)
    report.section("The performance model, refitted online (§5.1)", text.perf(trace))
    report.figure("perf_model_error", plots.perf_error(trace["steps"], trace["errors"],
                                                       trace["fits"]), "Prediction error")
    report.result("perf_model", {k: trace[k] for k in ("noise", "prior_error", "final_error",
                                                       "fitted", "true")})


def run(ctx: ExperimentContext) -> Report:
    cfg = QUICK if ctx.quick else FULL
    report = Report(ctx.output_dir, "Ascendra: LP and HP instance pools (simulated)")
    report.text(text.INTRO)
    report.result("quick", ctx.quick)
    panels = sweep_section(report, cfg, ctx.seed)
    slo_scale_section(report, cfg, panels, ctx.seed)
    pools_section(report, panels)
    overload_section(report, cfg, panels, ctx.seed)
    ablation_section(report, cfg, panels, ctx.seed)
    perf_section(report, cfg, ctx.seed)
    report.section("Against the paper", text.paper_comparison(report.results))
    report.section("Differences from the paper, and why",
                   text.differences(report.results["sweep"]))
    return report
