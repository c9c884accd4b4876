"""Figures of the Andes experiment (matplotlib, Agg backend, one PNG each)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from andante.bench.report import pyplot

COLORS = {"vllm": "tab:blue", "sarathi": "tab:orange", "lqsf": "tab:green",
          "andes": "tab:red"}



def curves(panels: Mapping[str, Mapping[str, Sequence[float]]], xs: Sequence[float],
           xlabel: str, ylabel: str = "average QoE", line: float | None = 0.95) -> Any:
    """One panel per setup; one line per policy (`panels[title][policy]` = ys)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels.items(), strict=True):
        for name, ys in series.items():
            ax.plot(xs[: len(ys)], ys, marker="o", label=name, color=COLORS.get(name))
        if line is not None:
            ax.axhline(line, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str,
         title: str = "") -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, (name, ys) in enumerate(series.items()):
        ax.bar(x + i * width, ys, width, label=name, color=COLORS.get(name))
    ax.set_xticks(x + width * (len(series) - 1) / 2, groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def side_by_side(left: Any, right: Any) -> Any:
    """Two callables (ax -> None) drawn next to each other."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.2, 3.4))
    left(axes[0])
    right(axes[1])
    fig.tight_layout()
    return fig


def cdfs(data: Mapping[str, np.ndarray], xlabel: str, log: bool = False) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.6, 3.4))
    for name, values in data.items():
        v = np.sort(values[np.isfinite(values)])
        ax.plot(v, np.arange(1, len(v) + 1) / max(1, len(v)), label=name,
                color=COLORS.get(name))
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def queues(data: Mapping[str, np.ndarray | None]) -> Any:
    """Waiting (solid) and running (dashed) requests over time, and KV usage."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(7.0, 4.6), sharex=True)
    for name, q in data.items():
        if q is None or not len(q):
            continue
        color = COLORS.get(name)
        axes[0].plot(q[:, 0], q[:, 1] + q[:, 3], color=color, label=f"{name} waiting")
        axes[0].plot(q[:, 0], q[:, 2], color=color, linestyle="--", label=f"{name} running")
        axes[1].plot(q[:, 0], 100 * q[:, 4], color=color, label=name)
    axes[0].set_ylabel("requests")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].set_ylabel("KV cache used (%)")
    axes[1].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
