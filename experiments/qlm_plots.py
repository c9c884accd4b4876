"""Figures of the QLM experiment (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from andante.bench.report import pyplot

STYLES = {  # system -> (label, color, marker)
    "qlm": ("QLM", "tab:red", "^"),
    "vllm": ("vLLM", "tab:blue", "o"),
    "edf": ("EDF", "tab:green", "s"),
    "shepherd": ("SHEPHERD", "tab:purple", "D"),
}



def sweep(xs: Sequence[float], curves: Mapping[str, Mapping[str, Sequence[float]]],
          xlabel: str, metrics: Sequence[tuple[str, str]]) -> Any:
    """One panel per metric: each system's curve against `xs`."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.4),
                             squeeze=False)
    for ax, (key, ylabel) in zip(axes.flat, metrics, strict=True):
        for system, curve in curves.items():
            label, color, marker = STYLES.get(system, (system, None, "x"))
            ax.plot(xs, curve[key], marker=marker, color=color, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def bars(rows: Sequence[Mapping[str, Any]], label_key: str,
         metrics: Sequence[tuple[str, str]]) -> Any:
    """One bar chart per metric over `rows` (e.g. the ablation)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.4),
                             squeeze=False)
    labels = [str(r[label_key]) for r in rows]
    for ax, (key, ylabel) in zip(axes.flat, metrics, strict=True):
        ax.bar(range(len(rows)), [r[key] for r in rows], color="tab:gray")
        ax.set_xticks(range(len(rows)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def queue_size(rows: Sequence[Mapping[str, Any]],
               series: Mapping[str, tuple[Sequence[float], Sequence[int]]]) -> Any:
    """Left: SLO attainment against the mean queue size per system (Fig. 16); right: the
    queue size over time per system."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.2, 3.4))
    for system in dict.fromkeys(r["system"] for r in rows):
        label, color, marker = STYLES.get(system, (system, None, "x"))
        mine = sorted((r["mean queue"], r["SLO attainment"]) for r in rows
                      if r["system"] == system)
        left.plot([q for q, _ in mine], [a for _, a in mine], marker=marker, color=color,
                  label=label)
        times, sizes = series[system]
        right.plot(times, sizes, color=color, label=label)
    left.set_xlabel("mean queue size (requests)")
    left.set_ylabel("SLO attainment")
    right.set_xlabel("time (s)")
    right.set_ylabel("queue size (requests)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    return fig


def close(fig: Any) -> None:
    """Free a saved figure (the experiment draws many)."""
    pyplot().close(fig)
