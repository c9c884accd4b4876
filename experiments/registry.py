"""Experiments by name: each reproduces a paper's evaluation in the simulator.

An experiment is a function `run(ctx: ExperimentContext) -> Report` in its own module
of this top-level `experiments` package (beside `benchmarks/`, outside the product
package); adding one is one line in EXPERIMENTS. `andante experiment NAME` finds this
package when the repository checkout is present.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from andante.bench.report import Report

EXPERIMENTS: MappingProxyType[str, str] = MappingProxyType({
    "fastserve": "experiments.fastserve:run",
    "andes": "experiments.andes:run",
    "ascendra": "experiments.ascendra:run",
    "qlm": "experiments.qlm:run",
    "kunserve": "experiments.kunserve:run",
})


@dataclass(frozen=True, slots=True)
class ExperimentContext:
    """output_dir: where the report goes; quick: a reduced sweep (CI smoke runs)."""

    output_dir: Path
    quick: bool = False
    seed: int = 0


def experiment_names() -> list[str]:
    return sorted(EXPERIMENTS)


def run_experiment(name: str, ctx: ExperimentContext) -> Report:
    target = EXPERIMENTS.get(name)
    if target is None:
        raise ValueError(f"unknown experiment {name!r}; choose one of {experiment_names()}")
    module_name, _, func = target.partition(":")
    report: Report = getattr(importlib.import_module(module_name), func)(ctx)
    report.write()
    return report
