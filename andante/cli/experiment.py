"""`andante experiment NAME`: reproduce a paper's evaluation and write a report.

The reproductions live in the repository's top-level `experiments/` package, outside
the product package; this command finds it in the checkout andante runs from (the
working directory, else the checkout holding this package) when the command runs, and
loads it from there without changing `sys.path`. Building the command line reads none
of it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from andante.cli.progress import Heartbeat

PACKAGE = "experiments"


def _registry() -> ModuleType | None:
    """`experiments.registry`: the package as Python finds it, else the checkout's."""
    if importlib.util.find_spec(PACKAGE) is None:
        init = next((root / PACKAGE / "__init__.py"
                     for root in (Path.cwd(), Path(__file__).resolve().parents[2])
                     if (root / PACKAGE / "registry.py").is_file()), None)
        if init is None:
            return None
        spec = importlib.util.spec_from_file_location(
            PACKAGE, init, submodule_search_locations=[str(init.parent)])
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package  # its modules import each other by this name
        spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}.registry")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "experiment",
        help="reproduce a paper's evaluation in the simulator (report + plots)",
        description="Reproduce a paper's evaluation: the experiments of the checkout's "
        "experiments/ package (an unknown NAME lists them).",
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
