"""`andante experiment NAME`: reproduce a paper's evaluation and write a report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from andante.bench.experiment import ExperimentContext, experiment_names, run_experiment


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "experiment",
        help="reproduce a paper's evaluation in the simulator (report + plots)",
        description=f"Experiments: {', '.join(experiment_names()) or '(none yet)'}.",
    )
    p.add_argument("name", help="experiment name")
    p.add_argument("--output", type=Path, help="report folder (default runs/experiment-NAME)")
    p.add_argument("--quick", action="store_true", help="a reduced sweep (minutes, not hours)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    output = args.output or Path("runs") / f"experiment-{args.name}"
    report = run_experiment(args.name, ExperimentContext(output, args.quick, args.seed))
    print(f"report: {report.directory / 'report.md'}")
    return 0
