"""Fit the step-time regression to measured steps (Ascendra §5.1, refitted online).

Design note. Ascendra regresses a step's latency on the features
[tM + tF, max(tM, tF), tM, tF, 1]. The first is the sum of the third and fourth, so C1
cannot be told apart from C3 and C4: any fit with C1 > 0 predicts exactly what the fit
with C1 = 0, C3 + C1, C4 + C1 predicts. We therefore solve the non-negative least-squares
problem on the four identifiable features and return C1 = 0 (the same minimum as NNLS
over all five). NNLS is exact by enumerating the 2^4 supports: the optimum is the
unconstrained least-squares solution on its own support. numpy only.

Thread regimes. A CPU engine runs small steps on one thread and the others on all of
them (andante.exec.torch_threads), and one coefficient set cannot serve both (the
measured residuals are in cost_model.py's note). `fit_by_threads` fits each regime its
own set, both with a sixth feature, tKV (the KV cache attention reads, over the
bandwidth; non-negative, so it stays 0 where it does not help). With fewer than
`MIN_REGIME_SAMPLES` steps in either regime one set is fitted to all steps.

New sizes. The first step of a token count the engine has not run recently costs more
(andante.perf.step_sizes); `fit_new_size` fits that extra time, fixed + per token, to
the differences between a cold and a warm run of the same step (non-negative least
squares, in seconds).

Tensor-parallel all-reduce time is modelled analytically by `CostModel`, so it is
subtracted from each measured duration before fitting.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients

Sample = tuple[BatchShape, float]

#: Measured steps each thread regime needs for a coefficient set of its own.
MIN_REGIME_SAMPLES = 6


def features(model: CostModel, shape: BatchShape) -> tuple[float, float, float, float, float]:
    """Ascendra's regression features of one step: [tM+tF, max(tM,tF), tM, tF, 1]."""
    t_m, t_f = model.terms(shape)
    return (t_m + t_f, max(t_m, t_f), t_m, t_f, 1.0)


def _check_samples(samples: Sequence[Sample]) -> None:
    if len(samples) == 0:
        raise ValueError("need at least one (BatchShape, duration) sample, got none")
    for index, (shape, duration) in enumerate(samples):
        if shape.num_tokens <= 0:
            raise ValueError(f"sample {index} is an empty step (num_tokens={shape.num_tokens})")
        if not (isinstance(duration, (int, float)) and math.isfinite(duration)
                and duration > 0):
            raise ValueError(f"sample {index} has an invalid duration {duration!r}")


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a·x - b|| subject to x >= 0, for a handful of columns."""
    num_cols = a.shape[1]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0.0] = 1.0
    a_scaled = a / scale
    best_x = np.zeros(num_cols)
    best_residual = float(np.dot(b, b))
    for size in range(1, num_cols + 1):
        for support in itertools.combinations(range(num_cols), size):
            cols = list(support)
            sub = a_scaled[:, cols]
            if np.linalg.matrix_rank(sub) < size:
                continue  # its optimum is reached on a smaller support
            solution, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(solution < -1e-12 * max(1.0, float(np.abs(solution).max()))):
                continue
            x = np.zeros(num_cols)
            x[cols] = np.clip(solution, 0.0, None)
            residual = float(np.sum((a_scaled @ x - b) ** 2))
            if residual < best_residual * (1.0 - 1e-12):
                best_x, best_residual = x, residual
    return best_x / scale


def fit_coefficients(model: CostModel, samples: Sequence[Sample],
                     relative: bool = True, kv_term: bool = False,
                     scale: Sequence[float] | None = None) -> CostCoefficients:
    """Non-negative least-squares coefficients for `model` from measured steps.

    With `relative` (the default) each step is weighted by 1 / duration, minimising the
    squared relative error, so short decode steps count as much as long prefills; or by
    1 / `scale` (per step, e.g. a previous fit's predictions: noisy single steps then
    do not pull the fit below their mean). With `kv_term` the KV read time tKV is a
    fifth feature (coefficient c6).
    """
    _check_samples(samples)
    rows = np.array([features(model, shape)[1:] + ((model.kv_read_time(shape),)
                                                   if kv_term else ())
                     for shape, _ in samples], dtype=float)
    durations = np.array([d for _, d in samples], dtype=float)
    comm = np.array([model.comm_time(shape.num_tokens) for shape, _ in samples])
    targets = durations - comm
    if relative:
        divisor = durations if scale is None else np.asarray(scale, dtype=float)
        rows = rows / divisor[:, None]
        targets = targets / divisor
    c2, c3, c4, c5, *c6 = (float(v) for v in _nnls(rows, targets))
    return CostCoefficients(c1=0.0, c2=c2, c3=c3, c4=c4, c5=c5, c6=c6[0] if c6 else 0.0)


def fit_by_threads(model: CostModel, samples: Sequence[Sample],
                   serial_below_tokens: int | None
                   ) -> tuple[CostCoefficients, CostCoefficients | None]:
    """(coefficients of the steps on all threads, of those with fewer than
    `serial_below_tokens` tokens, run on one thread, or None): see the module note.
    None, and one set fitted to every step, without a threshold or with fewer than
    MIN_REGIME_SAMPLES steps in either regime."""
    _check_samples(samples)
    if serial_below_tokens is None:
        return fit_coefficients(model, samples, kv_term=True), None
    serial = [s for s in samples if s[0].num_tokens < serial_below_tokens]
    parallel = [s for s in samples if s[0].num_tokens >= serial_below_tokens]
    if min(len(serial), len(parallel)) < MIN_REGIME_SAMPLES:
        return fit_coefficients(model, samples, kv_term=True), None
    return (fit_coefficients(model, parallel, kv_term=True),
            fit_coefficients(model, serial, kv_term=True))


def fit_new_size(extra: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(seconds, seconds per token) of the setup of a new step size, from (token count,
    cold minus warm seconds) pairs; (0, 0) without pairs. Noise can make a difference
    negative: the fit is non-negative, so it never predicts a saving. A pair that a
    burst of outside load hit (residual over 3 median absolute residuals, with at least
    MIN_REGIME_SAMPLES pairs) is left out and the rest refitted."""
    if not extra:
        return 0.0, 0.0
    for num_tokens, seconds in extra:
        if num_tokens <= 0 or not math.isfinite(seconds):
            raise ValueError(f"invalid new-size sample ({num_tokens!r}, {seconds!r})")
    rows = np.array([(1.0, float(n)) for n, _ in extra])
    targets = np.array([d for _, d in extra], dtype=float)
    coefficients = _nnls(rows, targets)
    if len(extra) >= MIN_REGIME_SAMPLES:
        residuals = np.abs(rows @ coefficients - targets)
        keep = residuals <= 3.0 * float(np.median(residuals))
        if 2 <= keep.sum() < len(extra):
            coefficients = _nnls(rows[keep], targets[keep])
    return float(coefficients[0]), float(coefficients[1])


def prediction_error(model: CostModel, samples: Sequence[Sample]) -> float:
    """Mean absolute relative error of `model.step_time` over measured steps."""
    _check_samples(samples)
    total = 0.0
    for shape, duration in samples:
        total += abs(model.step_time(shape) - duration) / duration
    return total / len(samples)
