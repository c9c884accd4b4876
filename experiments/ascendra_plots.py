"""Figures of the Ascendra experiment (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from andante.bench.report import pyplot

STYLES = {  # system -> (label, color, marker)
    "vllm": ("vLLM", "tab:blue", "o"),
    "sarathi": ("Sarathi-Serve (2048)", "tab:orange", "s"),
    "sarathi-512": ("Sarathi-Serve (512)", "tab:brown", "v"),
    "ascendra": ("Ascendra 2L1H", "tab:red", "^"),
    "ascendra-1l2h": ("Ascendra 1L2H", "tab:purple", "D"),
}



def goodput_curves(panels: Sequence[Mapping[str, Any]], xkey: str, xlabel: str,
                   target: float = 0.9) -> Any:
    """One panel per setup: goodput (share of requests within SLO) against `xkey`.

    Each panel: {"title", xkey: [...], "goodput": {system: [...]}}."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for system, values in panel["goodput"].items():
            label, color, marker = STYLES.get(system, (system, None, "x"))
            ax.plot(panel[xkey], [100 * v for v in values], marker=marker, color=color,
                    label=label)
        ax.axhline(100 * target, color="black", linestyle="--", linewidth=1)
        ax.set_ylim(0, 102)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("Goodput (% of requests within SLO)")
        ax.set_title(panel["title"], fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def overload_bars(counts: Mapping[str, Mapping[str, int]]) -> Any:
    """Fig. 12: requests served within SLO, served late and dropped, per system."""
    plt = pyplot()
    systems = list(counts)
    parts = (("good", "within SLO", "tab:green"), ("violated", "served, SLO missed",
                                                   "tab:orange"),
             ("dropped", "dropped", "tab:gray"))
    fig, ax = plt.subplots(figsize=(5.8, 3.6))
    width = 0.26
    for offset, (key, label, color) in enumerate(parts):
        xs = [i + (offset - 1) * width for i in range(len(systems))]
        ax.bar(xs, [counts[s][key] for s in systems], width, label=label, color=color)
    ax.set_xticks(range(len(systems)))
    ax.set_xticklabels([STYLES.get(s, (s,))[0] for s in systems])
    ax.set_ylabel("Requests")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def perf_error(steps: Sequence[int], errors: Sequence[float], fits: Sequence[int]) -> Any:
    """The online model's recent prediction error as steps accumulate (refits marked)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    ax.plot(steps, [100 * e for e in errors], color="tab:red")
    for step in fits:
        ax.axvline(step, color="gray", linewidth=0.8, linestyle=":")
    ax.axhline(10, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("Steps observed")
    ax.set_ylabel("Mean |relative error| (%)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
