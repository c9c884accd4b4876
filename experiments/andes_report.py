"""Tables, figures and results of the Andes experiment (one function per figure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from andante.bench.report import Report
from experiments import andes_chunked
from experiments import andes_plots as plots
from experiments import andes_text as text
from experiments.andes_runs import Outcome, Setup

if TYPE_CHECKING:
    from experiments.andes import Plan

THRESHOLD = 0.95


def sustained(xs: Sequence[float], ys: Sequence[float], threshold: float = THRESHOLD
              ) -> float | None:
    """The largest x up to which the curve stays >= threshold (linear interpolation
    at the first crossing); None if it starts below, the last x if it never drops."""
    if not ys or ys[0] < threshold:
        return None
    for k in range(1, len(ys)):
        if ys[k] < threshold:
            y0, y1 = ys[k - 1], ys[k]
            return xs[k - 1] + (y0 - threshold) / (y0 - y1) * (xs[k] - xs[k - 1])
    return xs[-1]


class Figures:
    """Looks outcomes up by figure coordinates and writes each figure's section."""

    def __init__(self, report: Report, plan: Plan, outcomes: Mapping[str, Outcome]) -> None:
        from experiments.andes import DEFAULT_INTENSITY, DEFAULT_SHARE, POLICIES

        self.report, self.plan, self.out = report, plan, outcomes
        self.policies, self.i0, self.d0 = POLICIES, DEFAULT_INTENSITY, DEFAULT_SHARE

    def burst(self, s: Setup, policy: str, intensity: float, share: float) -> Outcome:
        from experiments.andes import burst_key

        return self.out[burst_key(s, policy, intensity, share)]

    def qoe(self, s: Setup, policy: str, intensity: float, share: float) -> float:
        return self.burst(s, policy, intensity, share).mean_qoe

    def _sweep(self, name: str, xs: Sequence[float], xlabel: str, at: Any, caption: str
               ) -> dict[str, dict[str, list[float]]]:
        panels: dict[str, dict[str, list[float]]] = {}
        for s in self.plan.setups:
            series = {p: [at(s, p, x) for x in xs] for p in self.policies}
            panels[s.title] = series
            rows = [{"policy": p, **{f"{x:g}": v for x, v in zip(xs, ys, strict=True)}}
                    for p, ys in series.items()]
            self.report.text(f"**{s.title}** — average QoE by {xlabel}:")
            self.report.table(rows)
        self.report.figure(name, plots.curves(panels, xs, xlabel), caption)
        return panels

    def fig15(self) -> dict[str, Any]:
        self.report.section("Fig. 15: average QoE vs burst intensity",
                            text.FIG15.format(share=self.d0))
        xs = self.plan.intensities
        panels = self._sweep("fig15_intensity", xs, "burst intensity",
                             lambda s, p, x: self.qoe(s, p, x, self.d0),
                             "Average QoE vs burst intensity (burst duration 35 %)")
        held = {t: {p: sustained(xs, ys) for p, ys in series.items()}
                for t, series in panels.items()}
        rows = [{"setup": t, **{p: "< 1" if v is None else (f">= {v:g}" if v == xs[-1]
                                                             else f"{v:.2f}")
                                for p, v in h.items()}} for t, h in held.items()]
        self.report.text("Highest burst intensity each policy sustains at mean QoE 0.95:")
        self.report.table(rows)
        return {"qoe": panels, "sustained_intensity": held}

    def fig16(self) -> dict[str, Any]:
        self.report.section("Fig. 16: average QoE vs burst duration",
                            text.FIG16.format(intensity=self.i0))
        return {"qoe": self._sweep("fig16_duration", self.plan.shares, "burst duration share",
                                   lambda s, p, x: self.qoe(s, p, self.i0, x),
                                   "Average QoE vs burst duration (burst intensity 2)")}

    def _variant_rows(self, shares: Sequence[float], names: Sequence[str],
                      fields: Mapping[str, Any]) -> list[dict[str, Any]]:
        s = self.plan.ablation
        return [{"burst duration": d, "variant": n,
                 **{k: f(self.burst(s, n, self.i0, d)) for k, f in fields.items()}}
                for d in shares for n in names]

    def fig17(self) -> dict[str, Any]:
        self.report.section("Fig. 17: the overhead-aware refiner", text.FIG17)
        shares = self.plan.ablation_shares
        names = ("andes", "andes-norefiner", "andes-nobudget")
        fields = {"mean QoE": lambda o: o.mean_qoe,
                  "preemptions/request": lambda o: o.summary["mean_preemptions"]}
        rows = self._variant_rows(shares, names, fields)
        self.report.table(rows)
        series = {n: ([r["mean QoE"] for r in rows if r["variant"] == n],
                      [r["preemptions/request"] for r in rows if r["variant"] == n])
                  for n in names}
        self.report.figure("fig17_refiner", plots.side_by_side(
            _lines(shares, {n: v[0] for n, v in series.items()}, "average QoE"),
            _lines(shares, {n: v[1] for n, v in series.items()}, "preemptions / request")),
            "With and without the refiner (Llama-3.1-70B, burst intensity 2)")
        return {"rows": rows}

    def stall_weights(self, scale: float) -> dict[str, Any]:
        from experiments.andes import sw_name

        self.report.section("Refiner calibration: stall weight", text.STALL_WEIGHT)
        s, rows = self.plan.ablation, []
        for w in self.plan.stall_weights:
            for where, o in (("burst I=2, 35 %", self.burst(s, sw_name(w), self.i0, self.d0)),
                             (f"trace ×{scale:g}",
                              self.out[f"trace/{s.key}/{sw_name(w)}/{scale:g}"])):
                rows.append({"stall weight": w, "workload": where, "mean QoE": o.mean_qoe,
                             "share QoE >= 0.95": o.summary["qoe_attainment"],
                             "mean TTFT (s)": o.summary["mean_ttft_ms"] / 1e3,
                             "preemptions/request": o.summary["mean_preemptions"]})
        self.report.table(rows)
        return {"rows": rows}

    def fig18(self) -> dict[str, Any]:
        self.report.section("Fig. 18: greedy vs dynamic-programming solver", text.FIG18)
        shares, names = self.plan.dp_shares, ("andes", "andes-dp")
        fields = {"mean QoE": lambda o: o.mean_qoe,
                  "solver ms (mean)": lambda o: 1e3 * float(np.mean(o.solve_seconds or [0])),
                  "solves": lambda o: len(o.solve_seconds)}
        rows = self._variant_rows(shares, names, fields)
        self.report.table(rows)
        get = {n: ([r["mean QoE"] for r in rows if r["variant"] == n],
                   [r["solver ms (mean)"] for r in rows if r["variant"] == n]) for n in names}
        self.report.figure("fig18_solver", plots.side_by_side(
            _lines(shares, {n: v[0] for n, v in get.items()}, "average QoE"),
            _lines(shares, {n: v[1] for n, v in get.items()}, "solver time (ms)", log=True)),
            "Greedy (Alg. 1) vs 3-D DP (Appendix C)")
        return {"rows": rows}

    def fig19(self) -> dict[str, Any]:
        self.report.section("Fig. 19: QoE-gain horizon Δt", text.FIG19)
        s, deltas = self.plan.ablation, self.plan.deltas
        names = [("andes" if dt == 10.0 else f"andes-dt{dt:g}") for dt in deltas]
        andes = [self.qoe(s, n, self.i0, self.d0) for n in names]
        base = {p: self.qoe(s, p, self.i0, self.d0) for p in self.policies if p != "andes"}
        self.report.table([{"Δt (s)": dt, "andes": q} for dt, q in zip(deltas, andes, strict=True)]
                          + [{"Δt (s)": p, "andes": q} for p, q in base.items()])
        self.report.figure("fig19_delta_t", plots.curves(
            {s.title: {"andes": andes, **{p: [q] * len(deltas) for p, q in base.items()}}},
            deltas, "Δt (s)"), "Andes' average QoE vs Δt (baselines: flat lines)")
        return {"delta_t": list(deltas), "andes": andes, "baselines": base}

    def fig20(self) -> dict[str, Any]:
        self.report.section("Fig. 20: Poisson arrivals", text.FIG20)
        s, loads = self.plan.ablation, self.plan.poisson_loads
        series = {p: [self.out[f"poisson/{s.key}/{p}/{x:g}"].mean_qoe for x in loads]
                  for p in self.policies}
        self.report.table([{"policy": p, **{f"{x:g}R": v for x, v in zip(loads, ys, strict=True)}}
                           for p, ys in series.items()])
        self.report.figure("fig20_poisson", plots.curves({s.title: series}, loads,
                                                         "Poisson rate (multiples of R)"),
                           "Average QoE under Poisson arrivals")
        return {"loads": list(loads), "qoe": series}

    def objectives(self) -> dict[str, Any]:
        self.report.section("Appendix A: alternative objectives", text.OBJECTIVES)
        s = self.plan.ablation
        rows = []
        for name in ("andes", "andes-min", "andes-perfect"):
            o = self.burst(s, name, self.i0, self.d0)
            rows.append({"objective": name, "mean QoE": o.mean_qoe,
                         "p10 QoE": o.summary["p10_qoe"], "min QoE": o.summary["min_qoe"],
                         "share QoE >= 0.95": o.summary["qoe_attainment"]})
        self.report.table(rows)
        return {"rows": rows}


def _lines(xs: Sequence[float], series: Mapping[str, Sequence[float]], ylabel: str,
           log: bool = False) -> Any:
    def draw(ax: Any) -> None:
        for name, ys in series.items():
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xlabel("burst duration share")
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    return draw


def write(report: Report, plan: Plan, rates: Mapping[str, Mapping[str, float]],
          scales: Sequence[float], outcomes: Mapping[str, Outcome],
          trials: Mapping[str, Outcome], quick: bool) -> None:
    """scales: the calibrated trace scale, then (if different) the surge scale."""
    figs = Figures(report, plan, outcomes)
    traces = {sc: text.trace_stats(plan, sc, outcomes) for sc in scales}
    headline = text.headline(figs, traces[scales[0]], traces[scales[-1]])
    report.section("Setup", text.setup(plan, rates, scales, quick))
    report.section("Headline: reproduced vs paper", text.headline_markdown(headline, scales))
    results: dict[str, Any] = {"rates": rates, "trace_scales": list(scales), "quick": quick,
                               "headline": headline}
    results["fig15"], results["fig16"] = figs.fig15(), figs.fig16()
    results["fig17"] = figs.fig17()
    results["stall_weight"] = figs.stall_weights(scales[0])
    results["fig18"] = figs.fig18()
    results["fig19"], results["fig20"] = figs.fig19(), figs.fig20()
    if plan.objectives:
        results["appendix_a"] = figs.objectives()
    results["trace"] = text.trace_section(report, plan, outcomes, trials, traces)
    results["chunked_prefill"] = andes_chunked.section(report, plan, dict(outcomes))
    report.section("Where and why the figures differ", text.discussion(results))
    for key, value in results.items():
        report.result(key, value)
