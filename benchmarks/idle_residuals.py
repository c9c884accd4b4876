"""Does a step after an idle engine cost more than its shape? The residuals of a step log.

The check behind andante.perf.idle_wake (issue 31): fit the step-time model to one log
(`--fit-log`, e.g. a fidelity run's calibration part; default: the log itself, wake
left out), then read every step of `--log` (e.g. the whole run) against it: the residual
(measured - predicted) of the steps that follow another step at once, of the steps after
an idle gap, by the gap's length, and of the second step after such a gap. Prints one
JSON line (milliseconds; `se`: the standard error of the mean).

    python benchmarks/idle_residuals.py --log runs/fidelity_from_log/vllm-steps.jsonl \
        --fit-log runs/fidelity_from_log/vllm-calibration.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence

from andante.cli.calibrate_log import resolve_base, resolve_model
from andante.perf.cost_model import CostModel
from andante.perf.idle_wake import MIN_IDLE_GAP
from andante.perf.log_fit import fit_step_log
from andante.perf.step_log import LoggedStep, read_step_log

GAP_BOUNDS = (MIN_IDLE_GAP, 0.25, 0.5, 1.0, 2.0, 5.0, math.inf)  # seconds


def stats(residuals: Sequence[float]) -> dict[str, float | int]:
    n = len(residuals)
    if not n:
        return {"n": 0}
    mean = sum(residuals) / n
    var = sum((r - mean) ** 2 for r in residuals) / (n - 1) if n > 1 else 0.0
    ordered = sorted(residuals)
    return {"n": n, "mean_ms": round(mean * 1e3, 2),
            "median_ms": round(ordered[n // 2] * 1e3, 2),
            "se_ms": round(math.sqrt(var / n) * 1e3, 2)}


def residual_report(steps: Sequence[LoggedStep], model: CostModel) -> dict[str, object]:
    res = [s.duration - model.step_time(s.shape) for s in steps]
    gaps = [s.idle_before for s in steps]
    busy = [r for r, g in zip(res, gaps, strict=True) if g is not None and g < MIN_IDLE_GAP]
    by_gap = {}
    for low, high in zip(GAP_BOUNDS, GAP_BOUNDS[1:], strict=False):
        part = [r for r, g in zip(res, gaps, strict=True)
                if g is not None and low <= g < high]
        by_gap[f"{low:g}-{high:g} s"] = stats(part)
    second = [res[i + 1] for i, g in enumerate(gaps[:-1])
              if g is not None and g >= 1.0 and (gaps[i + 1] or 0.0) < MIN_IDLE_GAP]
    return {"back_to_back": stats(busy), "after_idle_gap": by_gap,
            "second_step_after_1s_idle": stats(second)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", required=True, help="the step log whose steps are read")
    p.add_argument("--fit-log", help="the step log the model is fitted to (default --log)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--base-hardware", default="cpu")
    args = p.parse_args(argv)
    try:
        fit_steps = [dataclasses.replace(s, idle_before=None)  # the shapes alone: no wake
                     for s in read_step_log(args.fit_log or args.log)]
        model_spec = resolve_model(args.model, "bfloat16")
        fit = fit_step_log(fit_steps, model_spec, resolve_base(args.base_hardware), "fit")
        steps = read_step_log(args.log)
    except ValueError as exc:
        print(f"idle_residuals: error: {exc}", file=sys.stderr)
        return 2
    report = residual_report(steps, CostModel(model_spec, fit.hardware))
    print(json.dumps({"benchmark": "idle_residuals", "log": args.log,
                      "fit_log": args.fit_log or args.log, "fit_error": round(fit.error, 4),
                      **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
