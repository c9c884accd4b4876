"""`andante calibrate`: fit the cost model to this machine and save a hardware profile.

A fit is only as good as the machine state it was measured in (a busy machine gives
steps that the fitted model cannot explain). So the fit's mean |relative error| over the
measured steps is printed and stored in the profile; a fit above `--max-error` is
refused (not saved; the profile in place stays) unless `--force`; and a profile that a
new fit replaces is kept as a dated copy `NAME-YYYYmmdd-HHMMSS`, itself a profile that
`--hardware` accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from andante.cli.calibrate_log import add_arguments as add_step_log_arguments
from andante.cli.calibrate_log import run_step_log
from andante.cli.options import positive_int

if TYPE_CHECKING:
    from andante.exec.torch_calibrate import Calibration
    from andante.perf.specs import HardwareSpec

MAX_FIT_ERROR = 0.15  # mean |relative error| of a fit above which it is not saved
CPU_PROFILE_NAME = "cpu"  # the profile a sweep of andante's CPU engine saves by default


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="fit a hardware profile: time real engine steps, or read an engine's step log",
        description="Run a short sweep of real steps (prefills, decodes, mixed), fit the "
                    "cost model's coefficients (Ascendra §5.1) and save the profile, so "
                    "`andante simulate --hardware cpu` predicts the real engine; or, with "
                    "--step-log, fit them to the steps any engine logged while serving "
                    "(andante serve --trace-steps, vLLM with andante's scheduler, "
                    "benchmarks/gpu_steps.py). Prints the "
                    "fit's mean error and stores it in the profile. A fit whose error "
                    f"exceeds --max-error (default {MAX_FIT_ERROR:.0%}) is not saved unless "
                    "--force; a profile it replaces is kept as NAME-YYYYmmdd-HHMMSS.",
    )
    p.add_argument("--model", help="HF model directory or .gguf file (default: embedded); "
                   "with --step-log: the served model, a catalog name or a directory with "
                   "config.json")
    p.add_argument("--name", help="profile name to save (default: cpu; required with "
                   "--step-log)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=positive_int,
                   help="torch threads (default: torch's); calibrate with the threads the "
                   "engine will serve with")
    p.add_argument("--repeats", type=positive_int, default=3, help="timings per shape")
    p.add_argument("--quick", action="store_true", help="a tiny sweep (smoke test)")
    p.add_argument("--max-error", type=_fraction, default=MAX_FIT_ERROR, metavar="FRACTION",
                   help="refuse to save a fit whose mean |relative error| exceeds this "
                   f"(default {MAX_FIT_ERROR})")
    p.add_argument("--force", action="store_true",
                   help="save the fit even if its error exceeds --max-error")
    p.add_argument("--dry-run", action="store_true", help="fit and print; do not save")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    add_step_log_arguments(p)
    p.set_defaults(run=run)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 10:
        raise argparse.ArgumentTypeError(f"must be a fraction > 0 (0.1 = 10%), got {text}")
    return value


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
    dated = stem = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 1
    while (directory / f"{dated}.json").exists():  # two calibrations in one second
        suffix += 1
        dated = f"{stem}-{suffix}"
    old = get_hardware(name, directory)
    save_hardware(dataclasses.replace(old, name=dated), directory)
    return dated


@dataclass(frozen=True, slots=True)
class SaveOutcome:
    """What became of a fit: saved (where, and the dated name of the profile it
    replaced), refused (over the threshold, nothing written), or a dry run."""

    hardware: HardwareSpec
    saved_to: Path | None
    previous: str | None
    refused: bool
    message: str | None  # the refusal, or the warning for a forced or dry-run bad fit


def save_fit(hardware: HardwareSpec, error: float, max_error: float = MAX_FIT_ERROR, *,
             force: bool = False, dry_run: bool = False,
             profiles_dir: Path | None = None) -> SaveOutcome:
    """Stamp the fit's error and date on `hardware` and save it unless it is refused."""
    from andante.perf.catalog import save_hardware

    stamped = dataclasses.replace(hardware, fit_error=round(error, 4),
                                  calibrated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                              time.gmtime()))
    over = error > max_error
    if dry_run:
        return SaveOutcome(stamped, None, None, False, _too_high(error, max_error) if over
                           else None)
    if over and not force:
        return SaveOutcome(stamped, None, None, True, _refusal(hardware.name, error,
                                                               max_error, profiles_dir))
    previous = keep_previous(hardware.name, profiles_dir)
    path = save_hardware(stamped, profiles_dir)
    message = f"{_too_high(error, max_error)}; saved anyway (--force)" if over else None
    return SaveOutcome(stamped, path, previous, False, message)


def _too_high(error: float, max_error: float) -> str:
    return (f"the fit's mean error is {error:.1%} (over {max_error:.0%}): this profile "
            "mispredicts the steps it was fitted on, so simulations with it will too; a busy "
            "machine is the usual cause: calibrate again when it is idle")


def _refusal(name: str, error: float, max_error: float, profiles_dir: Path | None) -> str:
    from andante.perf.catalog import describe_hardware, hardware_names

    kept = (f"; the profile in place is kept: {describe_hardware(name, profiles_dir)}"
            if name in hardware_names(profiles_dir) else "")
    return (f"not saved: {_too_high(error, max_error)} (or pass --max-error or --force)"
            f"{kept}")


def _measure(args: argparse.Namespace) -> tuple[str, Calibration]:
    """Time the sweep on the real engine and fit: (model name, calibration)."""
    from andante.exec.torch_calibrate import QUICK_SWEEP, SweepConfig, calibrate
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models.loader import load_model

    model = load_model(args.model, args.dtype)
    # exact step sizes, none warmed: the sweep times each size cold, then warm
    executor = TorchExecutor(model, TorchExecutorOptions(
        dtype=args.dtype, num_threads=args.threads, kv_cache_gib=1.0, swap_space_gib=0.25,
        step_buckets=False, warmup_tokens=None))
    sweep = QUICK_SWEEP if args.quick else SweepConfig()
    sweep = dataclasses.replace(sweep, repeats=args.repeats if not args.quick else 1)
    print(f"calibrating {model.name} ({args.dtype}) on {len(sweep.shapes())} step shapes",
          file=sys.stderr)
    result = calibrate(executor, sweep, args.name, progress=_progress)
    print(file=sys.stderr)
    return model.name, result


def run(args: argparse.Namespace) -> int:
    if args.step_log:
        return run_step_log(args, save_fit)
    if args.base_hardware or args.serial_below_tokens is not None or args.tp != 1 \
            or args.step_threads is not None:
        print("andante calibrate: error: --base-hardware, --tp, --serial-below-tokens and "
              "--step-threads go with --step-log", file=sys.stderr)
        return 2
    args.name = args.name or CPU_PROFILE_NAME
    model_name, result = _measure(args)
    outcome = save_fit(result.hardware, result.error, args.max_error, force=args.force,
                       dry_run=args.dry_run)
    if outcome.message:
        print(f"{'error' if outcome.refused else 'warning'}: {outcome.message}",
              file=sys.stderr)
    hw = outcome.hardware
    if args.json:
        print(json.dumps({
            "profile": hw.name, "model": model_name, "dtype": args.dtype,
            "num_samples": len(result.samples), "fit_error": hw.fit_error,
            "max_error": args.max_error, "refused": outcome.refused,
            "previous_saved_as": outcome.previous, "warning": outcome.message,
            "coefficients": dataclasses.asdict(hw.coefficients),
            "serial_below_tokens": hw.serial_below_tokens,
            "serial_coefficients": (dataclasses.asdict(hw.serial_coefficients)
                                    if hw.serial_coefficients else None),
            "new_size_fixed": hw.new_size_fixed, "new_size_per_token": hw.new_size_per_token,
            "new_size_cache": hw.new_size_cache,
            "peak_flops": hw.peak_flops, "mem_bandwidth": hw.mem_bandwidth,
            "host_link_bandwidth": hw.host_link_bandwidth,
            "saved_to": str(outcome.saved_to) if outcome.saved_to else None}))
        return 1 if outcome.refused else 0
    print(f"profile {hw.name!r}: mean |error| of the fit {result.error:.1%} over "
          f"{len(result.samples)} measured steps (threshold {args.max_error:.0%})")
    print(f"  rates: {hw.peak_flops / 1e9:.0f} GFLOP/s, {hw.mem_bandwidth / 1e9:.1f} GB/s "
          f"memory, {hw.host_link_bandwidth / 1e9:.1f} GB/s swap")
    print(f"  coefficients: {hw.coefficients}")
    if hw.serial_coefficients is not None:
        print(f"  steps below {hw.serial_below_tokens} tokens (run on one thread): "
              f"{hw.serial_coefficients}")
    if hw.new_size_cache:
        print(f"  first step of a size not run recently: +{hw.new_size_fixed * 1e3:.2f} ms "
              f"+ {hw.new_size_per_token * 1e3:.4f} ms/token (the last {hw.new_size_cache} "
              "sizes stay warm)")
    if outcome.saved_to:
        print(f"  saved to {outcome.saved_to}")
    else:
        print("  refused: not saved" if outcome.refused else "  (dry run: not saved)")
    if outcome.previous:
        print(f"  the previous profile is kept as {outcome.previous!r}")
    return 1 if outcome.refused else 0
