"""Figures of the FastServe experiment (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from andante.bench.report import pyplot

STYLES = {  # policy -> (label, color, marker), as in the paper's legends
    "vllm": ("vLLM", "tab:blue", "o"),
    "fastserve-fcfs": ("FastServe-FCFS", "tab:green", "s"),
    "fastserve": ("FastServe", "tab:red", "^"),
}



def latency_curves(panels: Sequence[Mapping[str, Any]], stat: str, ylabel: str) -> Any:
    """Fig. 11 (stat="mean") / Fig. 12 (stat="p95"): latency vs arrival rate per setup.

    Each panel: {"title", "rates", "slo", "curves": {policy: {stat: [...]}}}.
    """
    plt = pyplot()
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        slo = panel["slo"]
        for policy, curve in panel["curves"].items():
            label, color, marker = STYLES.get(policy, (policy, None, "x"))
            ax.plot(panel["rates"], curve[stat], marker=marker, color=color, label=label)
        ax.axhline(slo, color="black", linestyle="--", linewidth=1, label="SLO")
        ax.set_ylim(0, 4 * slo)
        ax.set_xlabel("Job arrival rate (job/s)")
        ax.set_ylabel(ylabel)
        ax.set_title(panel["title"], fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def kv_memory(traces: Mapping[str, Sequence[tuple[float, float, float]]],
              device_capacity_gb: float) -> Any:
    """Fig. 8: KV cache in use (device + host) over time, per scheduler."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    names = {"fastserve-fcfs": "FCFS", "fastserve": "MLFQ (FastServe)"}
    for policy, trace in traces.items():
        if not trace:
            continue
        times = [t for t, _, _ in trace]
        total = [d + h for _, d, h in trace]
        _, color, _ = STYLES.get(policy, (policy, None, ""))
        ax.plot(times, total, color=color, label=f"{names.get(policy, policy)}: device + host")
    ax.axhline(device_capacity_gb, color="black", linestyle=":", linewidth=1,
               label="device KV capacity")
    ax.set_xlabel("Time (s)")
    ax.set_ylabel("KV cache memory (GB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def kv_modes(rates: Sequence[float], curves: Mapping[str, Sequence[float]], slo: float) -> Any:
    """Fig. 15(a): mean per-token latency of FastServe's KV-cache strategies."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, values in curves.items():
        ax.plot(rates, values, marker="o", label=name)
    ax.axhline(slo, color="black", linestyle="--", linewidth=1, label="SLO")
    ax.set_ylim(0, 4 * slo)
    ax.set_xlabel("Job arrival rate (job/s)")
    ax.set_ylabel("Latency (s/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
