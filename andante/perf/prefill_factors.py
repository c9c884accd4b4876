"""Fit how a step's prefill size bends an engine's step time (`andante calibrate --step-log`).

Design note. Ascendra §5.1's regression is linear in a step's roofline terms, so a step
of p prefill tokens is predicted to cost a constant plus a cost per token. A served
engine need not be linear in p: on this project's 2-core machine vLLM CPU serving
SmolLM2-135M (issue 31, the quiet logs of `benchmarks/fidelity_from_log.py`) took
median 50 ms for a step of 32-63 prefill tokens and 75 ms for 64-95 (a kernel
change at 64 tokens), then less per token again up to 512. One linear fit of such a log
predicted the steps of 64-127 prefill tokens 16-29% short and those of 256-511 5-10%
long, in the calibration itself; a served workload of short prompts (32-256 tokens, the
fidelity check's) then ran slower prefills than the simulator charged, and its TTFT
came out low at every rate (a per-request decomposition of real and simulated TTFT put
most of the gap in the prefill step's own cost; the wait for the step in flight and the
front end were within a few milliseconds).

The model: a step with p > 0 prefill tokens (tokens that are not one-token decodes)
costs the regression's time times a factor of its size class floor(log2 p)
(HardwareSpec.prefill_factors; CostModel.prefill_factor), 1 for a class the log does not
fit. The fit, on the steps as their shapes cost them (the idle wake taken out):

- per class with at least MIN_CLASS_STEPS steps, the factor is the median of measured
  over predicted time (a median: one stalled step does not move it);
- it is kept only where it differs from 1 by at least MIN_DEVIATION and by at least
  MIN_STANDARD_ERRORS standard errors of the ratios' mean (noise of a few steps is no
  kernel change); others are 1, and a table of 1s is empty;
- the coefficients are then fitted again to the steps with each prefill step's time
  divided by its factor, and the factors again to the new coefficients
  (`andante.perf.log_fit`, FACTOR_REFITS rounds): a linear fit bent by the non-linear
  classes otherwise leaves its bias in the others.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from andante.perf.shape import BatchShape
from andante.perf.step_log import LoggedStep

MIN_CLASS_STEPS = 5  # steps of one size class a factor is fitted on, at the least
MIN_DEVIATION = 0.03  # a factor closer to 1 than this is 1
MIN_STANDARD_ERRORS = 2.0  # ... and one within this many standard errors of 1


def prefill_tokens(shape: BatchShape) -> int:
    """The step's tokens that are not one-token decodes (0: a decode step)."""
    return shape.num_tokens - shape.num_decode_seqs


def size_class(num_prefill_tokens: int) -> int:
    """floor(log2 p), the index of HardwareSpec.prefill_factors for p prefill tokens."""
    return num_prefill_tokens.bit_length() - 1


def fit_class_factors(steps: Sequence[LoggedStep], predict: Callable[[BatchShape], float],
                      size: Callable[[BatchShape], int]) -> tuple[float, ...]:
    """A factor table for `steps` against the regression `predict` (without factors),
    a step's class floor(log2 size(shape)), steps of size 0 left out: see the module
    note. `size` `prefill_tokens`: HardwareSpec.prefill_factors;
    andante.perf.decode_factors.decode_batch: HardwareSpec.decode_factors. () where no
    class differs from 1."""
    ratios: dict[int, list[float]] = {}
    for step in steps:
        n = size(step.shape)
        predicted = predict(step.shape)
        if n > 0 and predicted > 0:
            ratios.setdefault(size_class(n), []).append(step.duration / predicted)
    return class_factors(ratios)


def class_factors(ratios: dict[int, list[float]]) -> tuple[float, ...]:
    """A factor table from each size class's measured / predicted ratios (the module
    note's bounds; 1 for a class without a kept factor); () where none is kept."""
    factors = {index: _factor(values) for index, values in ratios.items()}
    kept = {index: f for index, f in factors.items() if f != 1.0}
    if not kept:
        return ()
    return tuple(kept.get(index, 1.0) for index in range(max(kept) + 1))


def _factor(ratios: list[float]) -> float:
    if len(ratios) < MIN_CLASS_STEPS:
        return 1.0
    ordered = sorted(ratios)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1]
                                                            + ordered[middle])
    mean = sum(ratios) / len(ratios)
    spread = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1))
    standard_error = spread / math.sqrt(len(ratios))
    deviation = abs(median - 1.0)
    if deviation < MIN_DEVIATION or deviation < MIN_STANDARD_ERRORS * standard_error:
        return 1.0
    return median


def divided_by(steps: Sequence[LoggedStep], factors: tuple[float, ...],
               size: Callable[[BatchShape], int]) -> list[LoggedStep]:
    """The steps with each step's duration divided by the factor of its class (as in
    `fit_class_factors`; steps of size 0 as they are): what the linear regression is
    fitted to."""
    if not factors:
        return list(steps)
    out = []
    for step in steps:
        n = size(step.shape)
        index = size_class(n) if n > 0 else -1
        if 0 <= index < len(factors) and factors[index] != 1.0:
            step = dataclasses.replace(step, duration=step.duration / factors[index])
        out.append(step)
    return out
