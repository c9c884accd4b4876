"""The KunServe report's explanations, computed from the runs (no prose written before
the numbers): which resource bound each comparison, what KunServe did (drops, restores,
how long its groups lived, bubble share), what the Llumnix-like baseline moved, and the
paper's table beside ours."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.kunserve_runs import MEMORY_FULL, SEQS_FULL, RunResult, slo_causes

PAPER_TABLE = {
    "p99_vs_vllm_14b": "12.7-72.2x", "p99_vs_infercept_14b": "12.7-72.2x",
    "p99_vs_llumnix_14b": "12.7-72.2x", "p99_vs_vllm_72b": "8.4-11.9x",
    "p99_vs_infercept_72b": "8.4-11.9x", "p99_vs_llumnix_72b": "8.4-11.9x",
    "p50_tpot_cost": "+15.8-22.7%", "exchange_speedup": "1.5x",
    "bubble_without_lookahead": "21.9%", "bubble_with_lookahead": "8.3%",
    "restore_p50_ttft": "-28%", "restore_p50_tpot": "-23%",
    "slo_violations_scale_1_5": "KunServe near 0 from scale ~2; baselines far higher",
    "seq_scale": "- (not a figure; §4.1: queued requests served with a larger batch)",
}


def _fmt(value: float, unit: str = "", digits: int = 2) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.{digits}f}{unit}"


def bound_of(result: RunResult) -> tuple[str, float, float]:
    """("memory" | "compute" | "nothing", seconds queued with KV full, with KV free)."""
    on_memory, on_compute = result.queued_seconds()
    if on_memory + on_compute <= 0:
        return "nothing", on_memory, on_compute
    return ("memory" if on_memory >= on_compute else "compute"), on_memory, on_compute


def binding_text(result: RunResult) -> str:
    """What bound one run while requests queued, in seconds by resource."""
    bound = result.bound_seconds()
    if not any(bound.values()):
        return "nothing queued"
    top = max(bound, key=lambda k: bound[k])
    return (f"requests queued {bound['memory']:.0f} s with KV >= {MEMORY_FULL:.0%} in use, "
            f"{bound['sequences']:.0f} s at the sequence budget (running >= "
            f"{SEQS_FULL:.0%} of max_num_seqs) and {bound['compute']:.0f} s with both to "
            f"spare (prefill compute): {top} bound longest")


def comparison_text(title: str, results: Mapping[str, RunResult]) -> str:
    """What bound this comparison, and what KunServe and Llumnix did in it."""
    vllm, kun = results["vllm"], results["kunserve"]
    kind, on_memory, on_compute = bound_of(vllm)
    lines = [f"- vLLM: {binding_text(vllm)}; memory against everything else: "
             f"{_bound_sentence(kind, on_memory)}"]
    lines.append(f"- KunServe: {kun.counters.get('num_drops', 0)} drops, "
                 f"{kun.counters.get('num_restores', 0)} restores, "
                 f"{kun.counters.get('num_grows', 0)} grows, "
                 f"{kun.counters.get('num_shrinks', 0)} shrinks, "
                 f"{len(kun.group_lifetimes)} group lives of "
                 f"{_lives(kun.group_lifetimes)}, {kun.groups_alive_at_end} alive at the end;"
                 f" bubble share {_bubble_text(kun)}; P50 TPOT "
                 f"{_pct(kun.percentile('tpot', 50) / vllm.percentile('tpot', 50) - 1)} vs "
                 f"vLLM; P99 TTFT {_fmt(kun.percentile('ttft', 99), ' s')} vs "
                 f"{_fmt(vllm.percentile('ttft', 99), ' s')}; {binding_text(kun)}.")
    if "llumnix" in results:
        llx = results["llumnix"]
        c = llx.counters
        lines.append(f"- Llumnix-like: {c.get('num_running_migrations', 0)} running and "
                     f"{c.get('num_waiting_migrations', 0)} queued requests migrated, "
                     f"{c.get('kv_bytes_migrated', 0) / 2**30:.1f} GiB of KV moved; P99 "
                     f"TTFT {_fmt(llx.percentile('ttft', 99), ' s')} "
                     f"({_fmt(vllm.percentile('ttft', 99) / llx.percentile('ttft', 99), 'x')}"
                     " lower than vLLM's).")
    return f"Computed from this run ({title}):\n" + "\n".join(lines)


def _bound_sentence(kind: str, on_memory: float) -> str:
    if kind == "memory":
        return "memory bound longer than compute, the condition KunServe's drop addresses."
    if kind == "compute":
        return ("prefill compute (or the batch) bound longer than memory; a drop can only "
                f"shorten the {on_memory:.0f} s of memory-bound queueing (and what queued "
                "behind it).")
    return "nothing queued: no system has anything to gain."


def _lives(lives: Sequence[float]) -> str:
    if not lives:
        return "-"
    return f"{min(lives):.1f}-{max(lives):.1f} s (mean {sum(lives) / len(lives):.1f} s)"


def _bubble(result: RunResult) -> float:
    permille = result.counters.get("bubble_permille", -1)
    return math.nan if permille < 0 else permille / 10


def _bubble_text(result: RunResult) -> str:
    value = _bubble(result)
    return "n/a (no group ran)" if not math.isfinite(value) else f"{value:.1f}%"


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{100 * value:+.1f}%"


def multiple(results: Mapping[str, RunResult], baseline: str) -> float:
    kun = results["kunserve"].percentile("ttft", 99)
    return results[baseline].percentile("ttft", 99) / kun if kun > 0 else math.nan


def paper_table(compared: Mapping[str, Mapping[str, RunResult]],
                ablation: Mapping[str, RunResult], long_run: Mapping[str, RunResult],
                slo: Mapping[str, list[float]], scales: Sequence[float],
                keys14: str, keys72: str, label72: str = "72B") -> list[dict[str, Any]]:
    """The paper's figures beside ours (each of ours computed from the runs); `label72`
    names the 72B run in its rows (its burst intensity)."""
    rows: list[dict[str, Any]] = []

    def add(key: str, claim: str, ours: str) -> None:
        rows.append({"claim": claim, "paper": PAPER_TABLE[key], "andante": ours})

    for size, key, label in (("14b", keys14, "14B"), ("72b", keys72, label72)):
        for base in ("vllm", "infercept", "llumnix"):
            add(f"p99_vs_{base}_{size}", f"P99 TTFT reduction vs {base}, {label}",
                _fmt(multiple(compared[key], base), "x"))
    main = compared[keys14]
    add("p50_tpot_cost", "P50 TPOT cost of KunServe (14B)", _pct(
        main["kunserve"].percentile("tpot", 50) / main["vllm"].percentile("tpot", 50) - 1))
    unco, coord = ablation.get("uncoordinated"), ablation.get("coordinated")
    if unco is not None and coord is not None:
        add("exchange_speedup", "coordinated exchange: P99 TTFT speedup", _fmt(
            unco.percentile("ttft", 99) / coord.percentile("ttft", 99), "x")
            + f" ({exchange_text(unco)})")
    full, flat = ablation.get("lookahead"), ablation.get("no_seq_scale")
    if full is not None and flat is not None:
        add("seq_scale", "group sequence budget scaled by its KV: P99 / P50 TTFT without "
            "it over with it", f"{_ratio(flat, full, 'ttft', 99)} / "
            f"{_ratio(flat, full, 'ttft', 50)} (P50 TPOT without it "
            f"{_pct(flat.percentile('tpot', 50) / full.percentile('tpot', 50) - 1)})")
    if "coordinated" in ablation and "lookahead" in ablation:
        add("bubble_without_lookahead", "bubble share without lookahead",
            _bubble_text(ablation["coordinated"]))
        add("bubble_with_lookahead", "bubble share with lookahead",
            _bubble_text(ablation["lookahead"]))
    on, off = long_run.get("restore"), long_run.get("no_restore")
    if on is not None and off is not None:
        add("restore_p50_ttft", "restoration: P50 TTFT change", _pct(
            on.percentile("ttft", 50) / off.percentile("ttft", 50) - 1))
        add("restore_p50_tpot", "restoration: P50 TPOT change", _pct(
            on.percentile("tpot", 50) / off.percentile("tpot", 50) - 1))
    cells = []
    for system in ("kunserve", "vllm", "infercept", "llumnix"):
        shares = slo.get(system)
        if shares:
            picked = [f"{100 * v:.0f}" for s, v in zip(scales, shares, strict=True) if s <= 5]
            cells.append(f"{system} {'/'.join(picked)}%")
    add("slo_violations_scale_1_5", "SLO violations at scale 1/2/3/4/5 (14B)",
        "; ".join(cells))
    return rows


def _ratio(a: RunResult, b: RunResult, metric: str, q: float) -> str:
    return _fmt(a.percentile(metric, q) / b.percentile(metric, q), "x")


def exchange_text(uncoordinated: RunResult) -> str:
    """How long the uncoordinated run's KV exchanges held the link against its P99 TTFT:
    uncoordinated, an activation waits for the whole exchange (coordinated, for one
    chunk; §4.2); each exchange can add at most its own seconds to a request's TTFT."""
    c = uncoordinated.counters
    drops = c.get("num_drops", 0)
    seconds = c.get("exchange_ms", 0) / 1000
    return (f"uncoordinated: {drops} exchanges held the link {seconds:.1f} s in all, "
            f"{seconds / max(1, drops):.2f} s each; its P99 TTFT "
            f"{_fmt(uncoordinated.percentile('ttft', 99), ' s')}: the stall is "
            f"{_fmt(100 * seconds / max(1, drops) / uncoordinated.percentile('ttft', 99), '%', 1)}"
            " of it")


def slo_text(results: Sequence[RunResult], scales: Sequence[float]) -> str:
    """Why requests violate the SLO at each scale: TTFT (queueing) or TPOT (batch)."""
    lines = []
    for scale in scales:
        causes = slo_causes(results, scale)
        cells = [f"{system} {100 * late:.0f}% TTFT + {100 * slow:.0f}% TPOT only"
                 for system, (late, slow) in causes.items()]
        lines.append(f"- scale {scale:g}: " + "; ".join(cells))
    return ("Computed from this run (over the TTFT SLO; within it but over the TPOT SLO; "
            f"the SLO's base is the best P50 of the {len(results)} systems run here):\n"
            + "\n".join(lines))


def headroom_text(kun: RunResult) -> str:
    """The burst's peak KV demand against the most that dropping can hold."""
    if not kun.headroom:
        return ""
    largest = max(kun.headroom)
    holds = ", ".join(f"{k}: {v:.2f}x" for k, v in sorted(kun.headroom.items()))
    peak = kun.peak_demand()
    verdict = "within what the drops can hold"
    if peak > kun.headroom[largest]:
        verdict = ("more than a group of every instance holds: memory binds after the "
                   "deepest drop (the cluster's instances cap how deep a group goes)")
    return (f"Peak KV demand (in use + queued) {_fmt(peak, 'x')} the undropped cluster's "
            f"blocks; a group of k instances holds ({holds}) its members' undropped "
            f"blocks: the peak is {verdict}.")


def differences_text(compared: Mapping[str, Mapping[str, RunResult]]) -> str:
    """Why our multiples differ from the paper's, from what bound each run."""
    lines = []
    for title, results in compared.items():
        kind, on_memory, on_compute = bound_of(results["vllm"])
        kun = results["kunserve"]
        lines.append(
            f"- {title}: {kind}-bound (vLLM queued {on_memory:.0f} s on full KV, "
            f"{on_compute:.0f} s with KV free); KunServe's P99 TTFT is "
            f"{_fmt(multiple(results, 'vllm'), 'x')} lower than vLLM's after "
            f"{kun.counters.get('num_drops', 0)} drops (bubble {_bubble_text(kun)}); "
            f"KunServe's {binding_text(kun)}. {headroom_text(kun)}")
    return "\n".join(lines)
