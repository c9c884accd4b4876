"""Text, tables and the paper comparison of the Ascendra experiment report."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.ascendra_setup import LP_OPTIONS, Setup

PAPER_THROUGHPUT = 1.7  # "up to 1.7x" vs vLLM and Sarathi-Serve at the goodput target
PAPER_OVERLOAD = 1.74  # more requests within SLO under ten minutes of overload
PAPER_SLO_SCALE = 4.0  # "up to 4x stricter SLOs" at 90% goodput

INTRO = f"""
Simulated reproduction of Ascendra's evaluation: three A100-80G instances, one GPU each.
Baselines: vLLM (FCFS, prefill-first, 256 sequences) and Sarathi-Serve (chunked
prefill, decodes first) with 2,048- and 512-token budgets, three identical instances
behind round robin. Ascendra: two LP instances (out-of-order EDF batching, 128
sequences, offload of at-risk prompts judged against a {LP_OPTIONS['hp_batch_tokens']:,}-token
HP batch) and one HP instance (prefill-first FCFS, elastic batch, decodes riding along)
behind the `ascendra` router (LP round robin, HP ticket, offloads to the shortest HP
queue). A request is good when it meets its TTFT SLO and its mean-TBT SLO (§8.2);
goodput is the share of good requests. All systems run the same engine, KV manager and
cost model (`andante.sim`); only the policies and the router differ.
"""

SWEEP = """
Poisson arrivals at multiples of the vLLM cluster's saturated throughput ("capacity").
The table gives each system's goodput; the headline table the highest rate with at
least 90% goodput (interpolated) and Ascendra's multiple over each baseline.
"""

SLO_SCALE = """
The rate is fixed where Ascendra's goodput is just above 90%; TTFT and TBT SLOs are
multiplied by the scale (below 1: stricter). Ascendra's LP policy sees the scaled SLOs
(EDF values, offload test); the baselines ignore SLOs.
"""

ABLATIONS = """
Ascendra variants on Mistral-7B/ShareGPT at and above capacity (goodput): the LP value
function (Fig. 11 left: EDF against SJF; FCFS and LJF added), the HP elastic batch
(Fig. 11 right), the HP decode mode and offloading itself.
"""

def differences(panels: Sequence[Mapping[str, Any]]) -> str:
    shares = [at[0] / p["capacity"] for p in panels for k, at in p["rate_at_90"].items()
              if k in ("vllm", "sarathi", "sarathi-512") and math.isfinite(at[0])]
    low, high = (min(shares), max(shares)) if shares else (math.nan, math.nan)
    above = []
    for p in panels:
        g = p["goodput"]
        best = [max(g[k][i] for k in ("vllm", "sarathi", "sarathi-512"))
                for i in range(len(p["rates"]))]
        ratios = [g["ascendra"][i] / b for i, b in enumerate(best) if b > 0][-2:]
        if ratios:
            above.append(f"{min(ratios):.1f}-{max(ratios):.1f}x ({p['key']})")
    return f"""
* **Idealized baselines.** Every system here runs on the same simulated engine: no
  Python scheduling overhead, no CUDA-graph or kernel differences, an exact cost model.
  The paper measured real vLLM and Sarathi-Serve deployments. In this simulator the
  baselines already reach 90% goodput at {100 * low:.0f}-{100 * high:.0f}% of the vLLM
  cluster's saturated throughput, which caps any policy's possible gain at the 90%
  target: no scheduler sustains much more than what the GPUs compute. The gap grows with
  load: above capacity Ascendra keeps most requests within SLO while the FCFS baselines
  collapse — at the two highest rates of the sweep its goodput is {", ".join(above)}
  the best baseline's.
* **LongBench is LongBench-like.** The dataset is not available offline; prompts and
  outputs are sampled from log-normal shapes (median 3,000 and 200 tokens, capped to
  an 8k context) instead of the real summarization set.
* **Tuning.** The offload margin (a 4,096-token HP batch rather than a smaller one) and
  mixed HP steps (decodes ride along with prefills instead of stalling) were chosen
  from a handful of runs on Mistral-7B/ShareGPT; the ablation table shows what the
  paper-literal choices give. Sarathi-Serve is shown with a 2,048- and a 512-token
  budget because the paper does not state its chunk size.
* **Overload rate.** The paper's "slightly above system capacity" is not a number; we
  run ten simulated minutes at 1.15x and at 1.45x the vLLM cluster's saturated
  throughput, every system dropping requests still waiting past their TTFT SLO (the
  paper drops for all). Dropping helps the FCFS baselines most (they no longer serve a
  backlog of hopeless requests), which narrows the gap at the lower rate.
* **The performance model** is exact in simulation (the simulated step times come from
  the same regression form), so its online refit is checked separately, against noisy
  measurements and a deliberately wrong prior; on the real engine it starts from the
  uncalibrated CPU profile (see the closing note of issue 7).
"""


def _rate(value: tuple[float, str]) -> str:
    rate, flag = value
    return "-" if not math.isfinite(rate) else f"{flag}{rate:.2f}"


def _ratio(ours: tuple[float, str], base: tuple[float, str]) -> float:
    if not (math.isfinite(ours[0]) and math.isfinite(base[0])) or base[0] <= 0:
        return math.nan
    return ours[0] / base[0]


def sweep_rows(panels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for panel in panels:
        for i, rate in enumerate(panel["rates"]):
            row: dict[str, Any] = {"setup": panel["key"], "rate": rate,
                                   "x capacity": rate / panel["capacity"]}
            for system, values in panel["goodput"].items():
                row[system] = values[i]
            rows.append(row)
    return rows


def headline_rows(panels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for panel in panels:
        at = panel["rate_at_90"]
        ours = at["ascendra"]
        rows.append({
            "setup": panel["key"], "capacity (req/s)": panel["capacity"],
            **{f"{k} @90%": _rate(v) for k, v in at.items() if k != "ascendra-1l2h"},
            "x vllm": _ratio(ours, at["vllm"]), "x sarathi-2048": _ratio(ours, at["sarathi"]),
            "x sarathi-512": _ratio(ours, at["sarathi-512"]), "paper": f"<= {PAPER_THROUGHPUT}x",
        })
    return rows


def scale_rows(panels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for panel in panels:
        for i, scale in enumerate(panel["scales"]):
            rows.append({"setup": panel["key"], "rate": panel["rate"], "SLO scale": scale,
                         **{k: v[i] for k, v in panel["goodput"].items()}})
    return rows


def strictest_scale(scales: Sequence[float], goodput: Sequence[float]) -> float:
    """The smallest SLO scale with at least 90% goodput (nan: none)."""
    ok = [s for s, g in zip(scales, goodput, strict=True) if g >= 0.9]
    return min(ok) if ok else math.nan


def pools(two_lp: tuple[float, str], two_hp: tuple[float, str]) -> str:
    return (f"Same workloads as the sweep. Highest rate at 90% goodput: 2L1H "
            f"{_rate(two_lp)} req/s, 1L2H {_rate(two_hp)} req/s (the paper: 2L1H is the "
            "better three-instance split).")


def _overload_ratios(counts: Mapping[str, Mapping[str, int]]) -> tuple[float, float]:
    """(good, dropped + violated) of Ascendra over the best baseline."""
    best = max(v["good"] for k, v in counts.items() if k != "ascendra")
    lost = {k: v["dropped"] + v["violated"] for k, v in counts.items()}
    base_lost = min(v for k, v in lost.items() if k != "ascendra")
    return counts["ascendra"]["good"] / max(best, 1), lost["ascendra"] / max(base_lost, 1)


def overload(setup: Setup, seconds: float, runs: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for run in runs:
        good, lost = _overload_ratios(run["counts"])
        parts.append(f"at {run['rate']:.2f} req/s ({run['factor']}x capacity) Ascendra serves "
                     f"{good:.2f}x as many requests within SLO as the best baseline and drops "
                     f"or misses {lost:.2f}x as many")
    joined = "; ".join(parts)
    return (f"{setup.title}, {seconds:.0f} s of Poisson arrivals; every system drops requests "
            f"still waiting past their TTFT SLO. {joined[:1].upper()}{joined[1:]} (the paper, "
            f"\"slightly above capacity\": {PAPER_OVERLOAD}x within SLO, about half as many "
            "dropped or missed). The figure shows the first rate.")


def perf(trace: Mapping[str, Any]) -> str:
    return (f"An online model that starts from a plain roofline (C2 = 1) and observes steps "
            f"timed by the calibrated A100 model with {100 * trace['noise']:.0f}% log-normal "
            f"noise: its recent prediction error falls from {100 * trace['prior_error']:.0f}% "
            f"to {100 * trace['final_error']:.1f}% once refitted (the paper: below 10% after "
            f"five minutes of data). Fitted {trace['fitted']}; true {trace['true']}. Inside "
            "the simulated runs the error is ~0, because the simulated durations are the "
            "regression's own predictions.")


def paper_comparison(results: Mapping[str, Any]) -> str:
    lines = ["| claim | paper | here |", "|---|---|---|"]
    for panel in results.get("sweep", []):
        at = panel["rate_at_90"]
        for base in ("vllm", "sarathi", "sarathi-512"):
            lines.append(f"| rate at 90% goodput, Ascendra / {base} ({panel['key']}) | up to "
                         f"{PAPER_THROUGHPUT}x | {_ratio(at['ascendra'], at[base]):.2f}x |")
    for panel in results.get("slo_scale", []):
        here = {k: strictest_scale(panel["scales"], v) for k, v in panel["goodput"].items()}
        lines.append(f"| strictest SLO scale at 90% goodput ({panel['key']}) | Ascendra up to "
                     f"{1 / PAPER_SLO_SCALE:g}x | " + ", ".join(
                         f"{k} {v:g}" if math.isfinite(v) else f"{k} none"
                         for k, v in here.items()) + " |")
    for run in results.get("overload", {}).get("runs", []):
        good, lost = _overload_ratios(run["counts"])
        lines.append(f"| within SLO at {run['factor']}x capacity (dropping), Ascendra / best "
                     f"baseline | {PAPER_OVERLOAD}x | {good:.2f}x |")
        lines.append(f"| dropped or missed at {run['factor']}x capacity, Ascendra / best "
                     f"baseline | ~0.5x | {lost:.2f}x |")
    pools_at = results.get("pools", {}).get("rate_at_90")
    if pools_at:
        lines.append(f"| 2L1H better than 1L2H | yes | {_rate(pools_at['ascendra'])} vs "
                     f"{_rate(pools_at['ascendra-1l2h'])} req/s |")
    perf_model = results.get("perf_model")
    if perf_model:
        lines.append(f"| performance-model error | < 10% | "
                     f"{100 * perf_model['final_error']:.1f}% (5% noise) |")
    return "\n".join(lines)
