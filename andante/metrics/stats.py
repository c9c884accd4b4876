"""Distribution statistics with numpy's default (linear) percentile interpolation, and
the one running mean (`RunningMean`) that policies and the cluster keep online."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class Stats:
    """count, mean, std (population, as vllm) and linear-interpolated percentiles.

    All float fields are NaN when count == 0.
    """

    count: int
    mean: float
    std: float
    min: float
    p10: float
    median: float
    p90: float
    p99: float
    max: float

    def scaled(self, factor: float) -> Stats:
        """The same statistics in other units (e.g. factor=1000 for seconds -> ms)."""
        return Stats(
            self.count,
            *(getattr(self, name) * factor for name in _FLOAT_FIELDS),
        )


class RunningMean:
    """The running mean of the values observed so far (`default` before the first)."""

    __slots__ = ("_count", "_default", "_total")

    def __init__(self, default: float = 0.0) -> None:
        self._default = default
        self._count = 0
        self._total = 0.0

    def observe(self, value: float) -> None:
        self._count += 1
        self._total += value

    @property
    def count(self) -> int:
        return self._count

    @property
    def mean(self) -> float:
        return self._total / self._count if self._count else self._default


_FLOAT_FIELDS = ("mean", "std", "min", "p10", "median", "p90", "p99", "max")
_QUANTILES = (0.0, 10.0, 50.0, 90.0, 99.0, 100.0)


def percentiles(values: Iterable[float] | npt.NDArray[np.float64]) -> Stats:
    """Stats of `values`; an empty input gives count 0 and NaN everywhere."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    if arr.size == 0:
        nan = math.nan
        return Stats(0, nan, nan, nan, nan, nan, nan, nan, nan)
    lo, p10, p50, p90, p99, hi = (float(q) for q in np.percentile(arr, _QUANTILES))
    return Stats(
        count=int(arr.size),
        mean=float(arr.mean()),
        std=float(arr.std()),
        min=lo,
        p10=p10,
        median=p50,
        p90=p90,
        p99=p99,
        max=hi,
    )
