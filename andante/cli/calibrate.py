"""`andante calibrate`: fit the cost model to this machine and save a hardware profile."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from andante.cli.options import positive_int


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="time real engine steps and save a fitted `cpu` hardware profile",
        description="Run a short sweep of real steps (prefills, decodes, mixed), fit the "
                    "cost model's coefficients (Ascendra §5.1) and save the profile, so "
                    "`andante simulate --hardware cpu` predicts the real engine.",
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


def run(args: argparse.Namespace) -> int:
    import dataclasses

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
    path = None if args.dry_run else save_hardware(result.hardware)
    hw = result.hardware
    record = {"profile": hw.name, "model": model.name, "dtype": args.dtype,
              "num_samples": len(result.samples), "fit_error": round(result.error, 4),
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
    return 0
