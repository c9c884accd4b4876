"""Bounded-memory statistics of a long stream of values: exact moments and a log-bucket
histogram for percentiles with a stated relative error (used for the pooled inter-token
latencies of a streamed run summary, one value per token)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from andante.metrics.stats import Stats

ITL_RELATIVE_ERROR = 0.005  # LogHistogram's default bound on a percentile's relative error
_SMALLEST = 1e-9  # values below this count as 0 (an absolute error of at most 1e-9)
_LARGEST = 1e9


class LogHistogram:
    """Counts of positive values in geometric buckets (DDSketch's layout, Masson et al.,
    VLDB 2019, §2): bucket i holds (γ^(i-1), γ^i] with γ = (1 + α) / (1 - α), and its
    representative 2γ^i / (γ + 1) is within relative error α of every value in it. A
    percentile interpolates linearly between the representatives of its two neighbouring
    ranks (as numpy's default), so it is within α of the exact one. Values below 1 ns
    count as 0; memory is fixed (about 4,200 buckets for α = 0.5 %)."""

    def __init__(self, relative_error: float = ITL_RELATIVE_ERROR) -> None:
        if not 0 < relative_error < 1:
            raise ValueError(f"relative_error must be in (0, 1), got {relative_error!r}")
        self._gamma = (1 + relative_error) / (1 - relative_error)
        self._log_gamma = math.log(self._gamma)
        self._offset = math.floor(math.log(_SMALLEST) / self._log_gamma)
        self._counts = np.zeros(math.ceil(math.log(_LARGEST) / self._log_gamma)
                                - self._offset + 1, dtype=np.int64)
        self.num_zeros = 0

    def add(self, values: npt.NDArray[np.float64]) -> None:
        small = values < _SMALLEST
        self.num_zeros += int(np.count_nonzero(small))
        big = np.minimum(values[~small], _LARGEST)
        index = np.ceil(np.log(big) / self._log_gamma).astype(np.int64) - self._offset
        self._counts += np.bincount(index, minlength=len(self._counts))

    @property
    def count(self) -> int:
        return self.num_zeros + int(self._counts.sum())

    def _at_ranks(self, ranks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Representatives of the values of 0-based `ranks` in sorted order."""
        cumulative = self.num_zeros + np.cumsum(self._counts)
        bucket = np.searchsorted(cumulative, ranks, side="right")
        value = 2 * self._gamma ** (bucket + self._offset) / (self._gamma + 1)
        return np.where(ranks < self.num_zeros, 0.0, value)

    def quantiles(self, qs: tuple[float, ...]) -> list[float]:
        """Linearly interpolated quantiles (q in [0, 100]) of the values added."""
        n = self.count
        if n == 0:
            return [math.nan] * len(qs)
        h = np.array(qs) / 100.0 * (n - 1)
        lo = np.floor(h).astype(np.int64)
        below, above = self._at_ranks(lo), self._at_ranks(np.minimum(lo + 1, n - 1))
        return [float(v) for v in below + (h - lo) * (above - below)]


@dataclass(slots=True)
class Moments:
    """Exact count, mean, M2 (Chan et al.'s pairwise update), min and max."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, values: npt.NDArray[np.float64]) -> None:
        n = len(values)
        if n == 0:
            return
        mean = float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        total = self.count + n
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.count = total
        self.low, self.high = min(self.low, float(values.min())), max(self.high,
                                                                       float(values.max()))

    def observe(self, value: float) -> None:
        """Add one value (Welford's update)."""
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.low, self.high = min(self.low, value), max(self.high, value)


def sketched_stats(moments: Moments, histogram: LogHistogram) -> Stats:
    """Stats with exact count, mean, std, min and max and percentiles from `histogram`
    (kept within [min, max])."""
    if moments.count == 0:
        return Stats(0, *([math.nan] * 8))
    p10, median, p90, p99 = (min(max(v, moments.low), moments.high)
                             for v in histogram.quantiles((10.0, 50.0, 90.0, 99.0)))
    return Stats(count=moments.count, mean=moments.mean, std=math.sqrt(moments.m2 / moments.count),
                 min=moments.low, p10=p10, median=median, p90=p90, p99=p99, max=moments.high)
