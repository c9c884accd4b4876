"""`andante experiment NAME`: reproduce a paper's evaluation and write a report.

The reproductions live in the repository's top-level `experiments/` package, outside
the product package; this command finds it in the checkout andante runs from.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from andante.cli.progress import Heartbeat


def _registry() -> ModuleType | None:
    """`experiments.registry` from the checkout (cwd or beside the andante package)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "experiments" / "registry.py").is_file() and str(root) not in sys.path:
            sys.path.append(str(root))
    try:
        return importlib.import_module("experiments.registry")
    except ModuleNotFoundError:
        return None


def add_parser(subparsers: Any) -> None:
    registry = _registry()
    names = ", ".join(registry.experiment_names()) if registry else "(none: no checkout)"
    p = subparsers.add_parser(
        "experiment",
        help="reproduce a paper's evaluation in the simulator (report + plots)",
        description=f"Experiments: {names}.",
    )
    p.add_argument("name", help="experiment name")
    p.add_argument("--output", type=Path, help="report folder (default runs/experiment-NAME)")
    p.add_argument("--quick", action="store_true", help="a reduced sweep (minutes, not hours)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    registry = _registry()
    if registry is None:
        print("andante experiment: the experiments/ package of the andante repository is "
              "not here; run it from a checkout", file=sys.stderr)
        return 2
    output = args.output or Path("runs") / f"experiment-{args.name}"
    ctx = registry.ExperimentContext(output, args.quick, args.seed)
    sweep = "the quick sweep" if args.quick else "the full sweep (--quick: minutes)"
    print(f"experiment {args.name}: simulating {sweep}; the report goes to {output}",
          file=sys.stderr, flush=True)
    with Heartbeat(f"experiment {args.name}"):
        report = registry.run_experiment(args.name, ctx)
    print(f"report: {report.directory / 'report.md'}")
    return 0
