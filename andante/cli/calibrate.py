"""`andante calibrate`: fit the cost model to this machine and save a hardware profile."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from andante.cli.options import positive_int

MAX_FIT_ERROR = 0.2  # mean |relative error| beyond which a fit is flagged


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="time real engine steps and save a fitted `cpu` hardware profile",
        description="Run a short sweep of real steps (prefills, decodes, mixed), fit the "
                    "cost model's coefficients (Ascendra §5.1) and save the profile, so "
                    "`andante simulate --hardware cpu` predicts the real engine. A profile "
                    "it replaces is kept as NAME-YYYYmmdd-HHMMSS; a fit whose mean error "
                    "exceeds 20% is flagged.",
    )
    p.add_argument("--model", help="HF model directory or .gguf file (default: embedded)")
    p.add_argument("--name", default="cpu", help="profile name to save (default: cpu)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timings per shape")
    p.add_argument("--quick", action="store_true", help="a tiny sweep (smoke test)")
    p.add_argument("--dry-run", action="store_true", help="fit and print; do not save")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.set_defaults(run=run)


def _progress(done: int, total: int) -> None:
    print(f"\r  step shapes measured: {done}/{total}", end="", file=sys.stderr, flush=True)


def keep_previous(name: str, profiles_dir: Path | None = None) -> str | None:
    """Keep the saved profile `name`, if any, as `NAME-YYYYmmdd-HHMMSS` (a profile of its
    own, for `--hardware`) before a new calibration replaces it; that name."""
    from andante.perf.catalog import get_hardware, save_hardware
    from andante.perf.paths import hardware_profiles_dir

    directory = profiles_dir or hardware_profiles_dir()
    if not (directory / f"{name}.json").is_file():
        return None
    dated = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    old = get_hardware(name, directory)
    save_hardware(dataclasses.replace(old, name=dated), directory)
    return dated


def fit_warning(error: float, previous: str | None) -> str | None:
    """The warning for a fit whose mean relative error exceeds MAX_FIT_ERROR, if any."""
    if error <= MAX_FIT_ERROR:
        return None
    keep = (f"; the previous profile is kept as {previous!r} (--hardware {previous})"
            if previous else "")
    return (f"the fit's mean error is {error:.0%} (over {MAX_FIT_ERROR:.0%}): this profile "
            "mispredicts the steps it was fitted on, so simulations with it will too; a busy "
            f"machine is the usual cause: calibrate again when it is idle{keep}")


def run(args: argparse.Namespace) -> int:
    from andante.exec.torch_calibrate import QUICK_SWEEP, SweepConfig, calibrate
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models.loader import load_model
    from andante.perf.catalog import save_hardware

    model = load_model(args.model, args.dtype)
    executor = TorchExecutor(model, TorchExecutorOptions(
        dtype=args.dtype, num_threads=args.threads, kv_cache_gib=1.0, swap_space_gib=0.25))
    sweep = QUICK_SWEEP if args.quick else SweepConfig()
    sweep = dataclasses.replace(sweep, repeats=args.repeats if not args.quick else 1)
    print(f"calibrating {model.name} ({args.dtype}) on {len(sweep.shapes())} step shapes",
          file=sys.stderr)
    result = calibrate(executor, sweep, args.name, progress=_progress)
    print(file=sys.stderr)
    previous = None if args.dry_run else keep_previous(args.name)
    path = None if args.dry_run else save_hardware(result.hardware)
    warning = fit_warning(result.error, previous)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    hw = result.hardware
    record = {"profile": hw.name, "model": model.name, "dtype": args.dtype,
              "num_samples": len(result.samples), "fit_error": round(result.error, 4),
              "previous_saved_as": previous, "warning": warning,
              "coefficients": dataclasses.asdict(hw.coefficients),
              "peak_flops": hw.peak_flops, "mem_bandwidth": hw.mem_bandwidth,
              "host_link_bandwidth": hw.host_link_bandwidth,
              "saved_to": str(path) if path else None}
    if args.json:
        print(json.dumps(record))
        return 0
    print(f"profile {hw.name!r}: mean |error| of the fit {result.error:.1%} over "
          f"{len(result.samples)} measured steps")
    print(f"  rates: {hw.peak_flops / 1e9:.0f} GFLOP/s, {hw.mem_bandwidth / 1e9:.1f} GB/s "
          f"memory, {hw.host_link_bandwidth / 1e9:.1f} GB/s swap")
    print(f"  coefficients: {hw.coefficients}")
    print(f"  saved to {path}" if path else "  (dry run: not saved)")
    if previous:
        print(f"  the previous profile is kept as {previous!r}")
    return 0
