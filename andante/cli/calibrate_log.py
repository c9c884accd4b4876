"""`andante calibrate --step-log FILE`: fit a hardware profile to a real engine's steps.

Whichever engine served: andante's own server (`andante serve --trace-steps FILE`),
vLLM running andante's scheduler class (`{"andante": {"step_log": PATH}}`), or the GPU
step benchmark (benchmarks/gpu_steps.py). The log gives each step's shape and measured
duration (andante.perf.step_log), its request and http records the front end's time
around the engine (andante.perf.frontend_log); `--base-hardware` the GPU's datasheet rates and
memory; `--model` the served model's shape. The fit (andante.perf.log_fit) refuses a
log too thin to fit, naming what is missing, and the profile is saved as
`andante calibrate` saves its own (refused over `--max-error`, the previous one kept
as NAME-YYYYmmdd-HHMMSS), so that `andante simulate --hardware NAME` uses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from andante.cli.options import positive_int
from andante.perf.log_fit import STALL_FACTOR

if TYPE_CHECKING:
    from andante.perf.log_fit import LogFit
    from andante.perf.specs import HardwareSpec, ModelSpec

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "from a step log", "fit to the steps a real engine logged instead of timing "
        "andante's CPU engine")
    g.add_argument("--step-log", metavar="FILE",
                   help="the engine's step log (JSON lines with \"kind\": \"step\")")
    g.add_argument("--base-hardware", metavar="NAME",
                   help="the GPU the log was recorded on (e.g. h100-80g, a100-80g, h200; "
                   "'cpu' for a CPU engine): its datasheet rates and memory are kept, the "
                   "coefficients fitted")
    g.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel GPUs per instance (default 1)")
    g.add_argument("--step-threads", type=positive_int, metavar="N",
                   help="fit only the steps run on N compute threads (a log that records "
                   "them: andante serve --trace-steps with a torch executor); the others "
                   "are left out and counted")
    g.add_argument("--serial-below-tokens", type=positive_int, metavar="N",
                   help="fit steps of fewer than N tokens their own coefficients (a CPU "
                   "engine that runs small steps on one thread)")


def resolve_model(name_or_path: str | None, dtype: str) -> ModelSpec:
    """A catalog model by name, or the architecture in a model directory's config.json."""
    from andante.models.config import config_from_hf
    from andante.perf.catalog import get_model, model_names

    if not name_or_path:
        raise ValueError("--step-log needs --model: the served model, a catalog name "
                         f"({', '.join(model_names())}) or a directory with config.json")
    if name_or_path in model_names():
        return get_model(name_or_path)
    config = Path(name_or_path) / "config.json"
    if not config.is_file():
        raise ValueError(f"--model {name_or_path!r} is neither a catalog model "
                         f"({', '.join(model_names())}) nor a directory with config.json")
    data = json.loads(config.read_text(encoding="utf-8"))
    name = Path(name_or_path).resolve().name
    return config_from_hf(data, name).with_dtype(DTYPE_BYTES[dtype], name)


def resolve_base(name: str | None) -> HardwareSpec:
    from andante.exec.torch_cost import CPU_PROFILE, cpu_hardware
    from andante.perf.catalog import get_hardware, hardware_names

    if not name:
        raise ValueError("--step-log needs --base-hardware: the GPU the log was recorded "
                         f"on, one of {', '.join(hardware_names())} ('cpu' for a CPU "
                         "engine); its datasheet rates are kept and the coefficients fitted")
    if name == CPU_PROFILE:
        return cpu_hardware()[0]
    return get_hardware(name)


def fit_log(args: argparse.Namespace) -> tuple[ModelSpec, LogFit]:
    from andante.perf.frontend_log import read_frontend
    from andante.perf.log_fit import fit_step_log
    from andante.perf.step_log import read_step_log

    if not args.name:
        raise ValueError("--step-log needs --name: the profile to save (e.g. my-h100)")
    model = resolve_model(args.model, args.dtype)
    base = resolve_base(args.base_hardware)
    steps = read_step_log(args.step_log)
    frontend = read_frontend(args.step_log)
    fit = fit_step_log(steps, model, base, args.name, args.tp, args.serial_below_tokens,
                       source=f"step log {args.step_log}", threads=args.step_threads)
    fit.hardware = dataclasses.replace(fit.hardware, frontend_in=frontend.frontend_in,
                                       frontend_out=frontend.frontend_out)
    fit.frontend = frontend
    return model, fit


def _report(args: argparse.Namespace, model: ModelSpec, fit: LogFit, outcome: Any) -> None:
    hw = outcome.hardware
    print(f"profile {hw.name!r}: mean |error| of the fit {fit.error:.1%} over "
          f"{fit.num_steps} logged steps of {', '.join(fit.engines) or 'an unnamed engine'} "
          f"(threshold {args.max_error:.0%})")
    print(f"  fitted on {hw.fitted_on}")
    for kind, err in fit.by_kind.items():
        print(f"  {kind:8s} {err.num_steps:5d} steps: mean |error| {err.mean_error:.1%}, "
              f"predicted/measured {err.ratio:.3f}")
    for threads, err in fit.by_threads.items():
        print(f"  {threads} thread(s) {err.num_steps:5d} steps: mean |error| "
              f"{err.mean_error:.1%}, predicted/measured {err.ratio:.3f}")
    if fit.num_other_threads:
        print(f"  {fit.num_other_threads} steps on other thread counts left out "
              f"(--step-threads {args.step_threads})")
    print(f"  coefficients: {hw.coefficients}")
    if hw.serial_coefficients is not None:
        print(f"  steps below {hw.serial_below_tokens} tokens: {hw.serial_coefficients}")
    if fit.frontend is not None:
        fe = fit.frontend
        print(f"  front end: {hw.frontend_in * 1e3:.1f} ms before the engine, "
              f"{hw.frontend_out * 1e3:.1f} ms after it ({fe.num_requests} request records, "
              f"{fe.num_matched} matched to http records)")
        if fe.note:
            print(f"  note: {fe.note}")
    if fit.idle_wake is not None:
        _report_wake(fit)
    if hw.prefill_factors:
        print(f"  prefill size factors: {factors_text(hw.prefill_factors)}")
    if hw.decode_factors:
        print(f"  decode batch factors: {factors_text(hw.decode_factors, 'decodes')}")
    if fit.num_on_floor:
        print(f"  launch floor: {hw.eager_launch_per_layer * model.num_layers * 1e3:.1f} ms "
              f"per step with prefill tokens ({fit.num_on_floor} steps on it)")
    if fit.num_stalled:
        print(f"  {fit.num_stalled} stalled steps left out (over {STALL_FACTOR:g}x, or under "
              f"1/{STALL_FACTOR:g} of, what the others predict)")
    if fit.num_derived_shapes:
        print(f"  note: {fit.num_derived_shapes} steps had no attn_pairs/kv_tokens_read; "
              "their attention work was estimated from the aggregates")
    if outcome.saved_to:
        print(f"  saved to {outcome.saved_to}; simulate with: andante simulate "
              f"--hardware {hw.name} --model {model.name}")
    else:
        print("  refused: not saved" if outcome.refused else "  (dry run: not saved)")
    if outcome.previous:
        print(f"  the previous profile is kept as {outcome.previous!r}")


def factors_text(factors: tuple[float, ...], unit: str = "tokens") -> str:
    """'64-127 tokens x1.25, 256-511 tokens x0.88' ('1 decode x1.30, 2-3 decodes x1.10'):
    the factors that are not 1 (andante.perf.prefill_factors; `unit` "decodes":
    andante.perf.decode_factors)."""
    sizes = [f"1 {unit.removesuffix('s')}"] + [f"{1 << i}-{(2 << i) - 1} {unit}"
                                               for i in range(1, len(factors))]
    return ", ".join(f"{size} x{f:.2f}" for size, f in zip(sizes, factors, strict=True)
                     if f != 1.0)


def _report_wake(fit: LogFit) -> None:
    wake = fit.idle_wake
    assert wake is not None
    if wake.penalty > 0:
        print(f"  idle wake: {wake.penalty * 1e3:.1f} ms more for a step after "
              f"{wake.after:.2f} s or more without one ({wake.num_woken} of "
              f"{wake.num_idle_steps} steps after an idle gap)")
    elif wake.note:
        print(f"  idle wake: {wake.note}")


def _wake_json(fit: LogFit) -> dict[str, Any]:
    wake = fit.idle_wake
    return {"idle_wake": fit.hardware.idle_wake, "idle_wake_after": fit.hardware.idle_wake_after,
            "idle_wake_note": wake.note if wake else None,
            "num_idle_steps": wake.num_idle_steps if wake else 0,
            "num_woken_steps": wake.num_woken if wake else 0}


def run_step_log(args: argparse.Namespace, save_fit: Callable[..., Any]) -> int:
    """Fit the log and save the profile with `save_fit` (andante.cli.calibrate's: the
    same refusal over --max-error and the same dated copy of a replaced profile)."""
    try:
        model, fit = fit_log(args)
        outcome = save_fit(fit.hardware, fit.error, args.max_error, force=args.force,
                           dry_run=args.dry_run)
    except ValueError as exc:  # a refused or unreadable log, a bad name: one clear line
        print(f"andante calibrate: error: {exc}", file=sys.stderr)
        return 2
    if outcome.message:
        print(f"{'error' if outcome.refused else 'warning'}: {outcome.message}",
              file=sys.stderr)
    if args.json:
        hw = outcome.hardware
        print(json.dumps({
            "profile": hw.name, "model": model.name, "step_log": args.step_log,
            "engines": fit.engines, "num_steps": fit.num_steps, "num_shapes": fit.num_shapes,
            "fit_error": hw.fit_error, "max_error": args.max_error,
            "refused": outcome.refused, "by_kind": {k: dataclasses.asdict(v)
                                                    for k, v in fit.by_kind.items()},
            "coefficients": dataclasses.asdict(hw.coefficients),
            "eager_launch_per_layer": hw.eager_launch_per_layer,
            "prefill_factors": list(hw.prefill_factors),
            "decode_factors": list(hw.decode_factors),
            "frontend_in": hw.frontend_in, "frontend_out": hw.frontend_out,
            "frontend_note": fit.frontend.note if fit.frontend else None,
            "num_request_records": fit.frontend.num_requests if fit.frontend else 0,
            "num_matched_http": fit.frontend.num_matched if fit.frontend else 0,
            **_wake_json(fit),
            "by_threads": {str(k): dataclasses.asdict(v) for k, v in fit.by_threads.items()},
            "num_other_threads": fit.num_other_threads,
            "num_on_floor": fit.num_on_floor, "num_stalled": fit.num_stalled,
            "fitted_on": hw.fitted_on,
            "previous_saved_as": outcome.previous, "warning": outcome.message,
            "saved_to": str(outcome.saved_to) if outcome.saved_to else None}))
    else:
        _report(args, model, fit, outcome)
    return 1 if outcome.refused else 0
