"""Fit what a step costs more when the engine was idle before it (`andante calibrate --step-log`).

Design note. A served engine that ran out of work and waits for a request does not start
its next step as it runs one step after another: vLLM CPU's engine core blocks on its
input queue, its worker threads park, and the machine's other processes take its caches.
On this project's 2-core machine (issue 31, vLLM CPU serving SmolLM2-135M, two logs of
`benchmarks/fidelity_from_log.py`) the step that followed an idle gap of 1 s or more
took 16-19 ms (about 20%) longer than the step-time fit predicts, 21 such steps in each
log, while steps that followed another step at once were within 0.5 ms of it, the step
after the woken one too, and steps after gaps of 0.2-0.7 s within noise of it. The
simulator's steps cost their shape only, so it predicted TTFT 14-15% low at 0.5 req/s,
where half the requests find the engine idle, and within 10% at higher rates.

The model: a step that starts after the engine ran no step for at least `after` seconds
costs `penalty` seconds more (HardwareSpec.idle_wake and idle_wake_after; the simulator
adds it where an instance starts a step after being idle). The fit reads each step's
`idle_before` (andante.perf.step_log, from the log's end times) and its residual against
the fitted step-time model (measured - predicted):

- idle steps are those after a gap of at least MIN_IDLE_GAP (a step that follows
  another at once starts within a millisecond of its end);
- for each threshold among the idle steps' gaps (at least MIN_WOKEN_STEPS steps at or
  above it) the penalty is their mean residual; the threshold kept is the one with the
  least squared error over the idle steps (those below it predicted with no penalty),
  so the data say where waking starts to cost; `after` is midway between it and the
  longest gap below it;
- the penalty is kept only if it is positive and at least MIN_T_STAT standard errors
  of its mean above 0; otherwise it is 0 and the fit says why (a log without idle gaps
  says so too: its steps cannot tell). The bounds (6 steps, 3 standard errors, strict
  for one test because the threshold is searched) were set on the logs at hand: they
  keep the 20-26 ms of both quiet logs above and refuse the 188 ms that 4 stalled steps
  of a log recorded at load 13 gave with 4 steps and 2.5.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from andante.perf.shape import BatchShape
from andante.perf.step_log import LoggedStep

MIN_IDLE_GAP = 0.01  # seconds without a step that make the next one a step after idle
MIN_WOKEN_STEPS = 6  # steps a penalty is fitted on, at the least
MIN_T_STAT = 3.0  # the penalty's mean over its standard error, at the least


@dataclass(frozen=True, slots=True)
class IdleWakeFit:
    """The extra seconds of a step after `after` seconds idle, and what they rest on."""

    penalty: float  # seconds (0: none found)
    after: float  # seconds idle from which it applies (0 where penalty is 0)
    num_idle_steps: int  # steps after a gap of at least MIN_IDLE_GAP
    num_woken: int  # of them, after a gap of at least `after` (the penalty's steps)
    mean_residual_busy: float  # mean residual of the steps that followed another at once
    note: str | None = None  # why the penalty is 0, where it is


def _residuals(steps: Sequence[tuple[float, float]], after: float
               ) -> tuple[float, float, int]:
    """(penalty, squared error over all idle steps, woken count) for threshold `after`;
    `steps` are (gap, residual) pairs."""
    woken = [r for g, r in steps if g >= after]
    penalty = sum(woken) / len(woken)
    error = sum((r - penalty) ** 2 for r in woken) + sum(r * r for g, r in steps if g < after)
    return penalty, error, len(woken)


def _t_stat(values: Sequence[float]) -> float:
    """Mean over its standard error (inf where the values do not vary)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return math.inf if var == 0 else mean / math.sqrt(var / n)


def fit_idle_wake(steps: Sequence[LoggedStep], predict: Callable[[BatchShape], float]
                  ) -> IdleWakeFit:
    """The idle-wake penalty of `steps` against the step-time model `predict` (the
    module note); never raises on a log without gaps: it fits 0 and says so."""
    known = [(s.idle_before, s.duration - predict(s.shape)) for s in steps
             if s.idle_before is not None]
    pairs = [(g, r) for g, r in known if g >= MIN_IDLE_GAP]  # (gap, residual)
    busy = [r for g, r in known if g < MIN_IDLE_GAP]
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    if not known:
        return IdleWakeFit(0.0, 0.0, 0, 0, mean_busy, "the log's steps carry no end times "
                           "('t'), so the engine's idle gaps are unknown: no wake-up "
                           "cost fitted (0)")
    if len(pairs) < MIN_WOKEN_STEPS:
        return IdleWakeFit(0.0, 0.0, len(pairs), 0, mean_busy,
                           f"only {len(pairs)} steps followed an idle gap of "
                           f"{MIN_IDLE_GAP * 1e3:.0f} ms or more (a fit needs "
                           f"{MIN_WOKEN_STEPS}): no wake-up cost fitted (0); record "
                           "some requests that find the engine idle")
    thresholds = sorted({g for g, _ in pairs})
    best: tuple[float, float, float, int] | None = None  # (error, after, penalty, woken)
    for after in thresholds:
        penalty, error, woken = _residuals(pairs, after)
        if woken < MIN_WOKEN_STEPS:
            break
        if best is None or error < best[0]:
            best = (error, after, penalty, woken)
    assert best is not None  # the lowest threshold has every idle step
    _, gap, penalty, woken = best
    woken_residuals = [r for g, r in pairs if g >= gap]
    t_stat = _t_stat(woken_residuals)
    if penalty <= 0 or t_stat < MIN_T_STAT:
        return IdleWakeFit(0.0, 0.0, len(pairs), woken, mean_busy,
                           f"the {len(pairs)} steps after an idle gap are no slower than "
                           f"the fit predicts beyond noise (best: {penalty * 1e3:+.1f} ms "
                           f"over {woken} steps after {gap:.2f} s idle, {t_stat:.1f} "
                           f"standard errors; {MIN_T_STAT:g} needed): no wake-up cost "
                           "fitted (0)")
    return IdleWakeFit(penalty, _boundary(thresholds, gap), len(pairs), woken, mean_busy)


def _boundary(gaps: Sequence[float], first_woken: float) -> float:
    """Where waking starts to cost: midway between the shortest gap whose steps pay the
    penalty and the longest that does not (MIN_IDLE_GAP where every idle step pays)."""
    below = [g for g in gaps if g < first_woken]
    return (max(below) + first_woken) / 2 if below else MIN_IDLE_GAP
