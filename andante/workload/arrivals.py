"""Synthetic arrival processes: Poisson, Gamma renewal, and Andes' cyclic bursts.

Every generator returns a sorted float64 array of arrival times in seconds from 0 (the
first arrival comes one inter-arrival gap after 0) and stops at whichever bound comes
first: `num` arrivals, or the last arrival at or before `duration` seconds. At least one
bound is required. Randomness comes only from the `numpy.random.Generator` passed in.

Design note — cyclic burst load pattern (Andes, §6.3 and Fig. 14). Andes characterises a
burst by two numbers: *intensity*, "the ratio of request rate from burst to the entire
trace", and *duration*, "the percentage of time the burst takes up in the whole trace";
arrivals in both phases are Poisson, the phases alternate cyclically, and "the average
request rate of the whole cycle is set to be the serving system's throughput". We follow
that reading literally: `rate` is the mean rate R over a whole cycle, the burst runs at
I·R for the first D·L seconds of each cycle of length L, and the rest of the cycle runs
at the non-burst rate R·(1 − I·D)/(1 − D), so the cycle's mean is exactly R. (The burst
is therefore I·(1 − D)/(1 − I·D) times the non-burst rate: 4.33× at Andes' defaults
I = 2, D = 35 %.) This needs I·D ≤ 1. Andes' 20-minute synthetic traces and BurstGPT's
"three bursts per hour" suggest a cycle of 1,200 s, our default in the builder.
The piecewise-constant Poisson process is drawn exactly by time rescaling: unit-rate
Poisson points u_k are mapped through the inverse of the cumulative rate Λ(t).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

_Draw = Callable[[int], np.ndarray]


def _check_rate(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_bounds(num: int | None, duration: float | None) -> None:
    if num is None and duration is None:
        raise ValueError("give num or duration (or both) to bound the arrivals")
    if num is not None and num < 0:
        raise ValueError(f"num must be >= 0, got {num!r}")
    if duration is not None and not (math.isfinite(duration) and duration >= 0):
        raise ValueError(f"duration must be finite and >= 0, got {duration!r}")


def _renewal(draw: _Draw, mean_gap: float, num: int | None, horizon: float | None) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps from `draw`, bounded by count and/or horizon."""
    if num is not None:
        times = np.cumsum(draw(num))
        return times if horizon is None else times[times <= horizon]
    assert horizon is not None
    chunks: list[np.ndarray] = []
    last = 0.0
    while last <= horizon:
        size = int(1.2 * (horizon - last) / mean_gap) + 64
        chunk = last + np.cumsum(draw(size))
        chunks.append(chunk)
        last = float(chunk[-1])
    times = np.concatenate(chunks)
    return times[times <= horizon]


def poisson(
    rate: float, num: int | None, rng: np.random.Generator, *, duration: float | None = None
) -> np.ndarray:
    """Poisson arrivals at `rate` requests/s (exponential inter-arrival gaps)."""
    _check_rate("rate", rate)
    _check_bounds(num, duration)
    return _renewal(lambda n: rng.exponential(1.0 / rate, n), 1.0 / rate, num, duration)


def gamma(
    rate: float,
    cv: float,
    num: int | None,
    rng: np.random.Generator,
    *,
    duration: float | None = None,
) -> np.ndarray:
    """Gamma renewal arrivals: mean gap 1/rate, gap coefficient of variation `cv`.

    Shape k = 1/cv², scale = 1/(rate·k); cv = 1 is the Poisson process, cv > 1 burstier.
    """
    _check_rate("rate", rate)
    _check_rate("cv", cv)
    _check_bounds(num, duration)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    return _renewal(lambda n: rng.gamma(shape, scale, n), 1.0 / rate, num, duration)


def burst_rates(rate: float, burst_intensity: float, burst_share: float) -> tuple[float, float]:
    """(burst-phase rate, non-burst rate) for mean rate R, intensity I, duration share D."""
    _check_rate("rate", rate)
    if not (math.isfinite(burst_intensity) and burst_intensity >= 1):
        raise ValueError(f"burst_intensity must be >= 1, got {burst_intensity!r}")
    if not (math.isfinite(burst_share) and 0 <= burst_share <= 1):
        raise ValueError(f"burst_share must be in [0, 1], got {burst_share!r}")
    if burst_intensity * burst_share > 1 + 1e-12:
        raise ValueError(
            f"burst_intensity × burst_share must be <= 1 (the burst alone would exceed the "
            f"cycle's mean rate), got {burst_intensity!r} × {burst_share!r}"
        )
    if burst_share >= 1:
        return rate * burst_intensity, 0.0
    base = rate * max(0.0, 1 - burst_intensity * burst_share) / (1 - burst_share)
    return rate * burst_intensity, base


def cyclic_burst(
    rate: float,
    burst_intensity: float,
    burst_share: float,
    cycle_length: float,
    num: int | None,
    rng: np.random.Generator,
    *,
    duration: float | None = None,
    cv: float = 1.0,
) -> np.ndarray:
    """Andes' cyclic bursts (see the module note): mean rate `rate` over each cycle.

    Each cycle of `cycle_length` s opens with a burst of `burst_share`·cycle_length s at
    `burst_intensity`·rate, then runs at the lower rate that keeps the cycle's mean at
    `rate` (`burst_rates` gives both rates). `cv` > 1 draws the unit-rate points as a
    Gamma renewal of that gap coefficient of variation instead of Poisson (BurstGPT's
    arrivals fit Gamma gaps, burstier than Poisson, within its bursts).
    """
    _check_rate("cv", cv)
    _check_rate("cycle_length", cycle_length)
    _check_bounds(num, duration)
    burst_rate, base_rate = burst_rates(rate, burst_intensity, burst_share)
    burst_len = burst_share * cycle_length
    burst_mass = burst_rate * burst_len  # expected arrivals in one burst phase
    cycle_mass = rate * cycle_length  # expected arrivals in one cycle

    def cumulative(t: float) -> float:
        cycles, offset = divmod(t, cycle_length)
        inside = min(offset, burst_len) * burst_rate + max(0.0, offset - burst_len) * base_rate
        return cycles * cycle_mass + inside

    horizon = None if duration is None else cumulative(duration)
    if cv == 1.0:
        units = _renewal(lambda n: rng.exponential(1.0, n), 1.0, num, horizon)
    else:
        shape = 1.0 / (cv * cv)
        units = _renewal(lambda n: rng.gamma(shape, 1.0 / shape, n), 1.0, num, horizon)
    cycles, mass = np.divmod(units, cycle_mass)
    in_burst = mass < burst_mass
    safe_base = base_rate if base_rate > 0 else 1.0
    offsets = np.where(
        in_burst,
        mass / burst_rate,
        burst_len + (mass - burst_mass) / safe_base,
    )
    times: np.ndarray = cycles * cycle_length + np.minimum(offsets, cycle_length)
    if duration is not None:
        times = times[times <= duration]
    return np.sort(times)
