"""A run's summary: throughput, latency distributions, QoE, SLO attainment and goodput.

Latency, token and throughput figures follow `vllm bench serve`: they are taken over
completed requests only. QoE, SLO attainment and preemptions are taken over every
request; a request still in flight is judged at `now` (its QoE mid-flight).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import chain

import numpy as np
import numpy.typing as npt

from andante.metrics.latency import e2el, tpot, ttft
from andante.metrics.qoe import DEFAULT_TDS, DEFAULT_TTFT_TARGET, qoe_all
from andante.metrics.record import RequestRecord
from andante.metrics.slo import check_goodput_thresholds, is_good, is_good_by_slo, meets_slo
from andante.metrics.stats import Stats, percentiles
from andante.metrics.table import format_table

__all__ = ["Stats", "Summary", "format_table", "percentiles", "pooled_itls", "summarize"]

_LATENCIES = ("ttft", "tpot", "itl", "e2el")
_LATENCY_STATS = ("mean", "median", "std", "p90", "p99")
_QOE_STATS = ("mean", "median", "p10", "min")
NUM_FIRST_REJECTIONS = 3


@dataclass(frozen=True, slots=True)
class Summary:
    """Figures of one run; latencies in seconds (to_dict gives ms, as vllm).

    Every request is counted once: num_finished (completed, num_truncated of them cut
    short by the context or KV limit) + num_aborted (num_rejected of them refused) +
    num_unfinished == num_requests.
    """

    num_requests: int
    num_finished: int
    num_aborted: int
    num_unfinished: int
    num_truncated: int  # of num_finished: cut by a length limit before max_tokens
    num_rejected: int  # of num_aborted: refused, never run
    first_rejections: tuple[str, ...]  # "request_id: reason" of the first few rejected
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Stats
    tpot: Stats
    itl: Stats
    e2el: Stats
    qoe: Stats
    qoe_threshold: float
    qoe_attainment: float
    slo_attainment: float
    num_good: int
    request_goodput: float
    mean_preemptions: float

    def to_dict(self) -> dict[str, float | int | None]:
        """Flat and JSON-friendly (NaN becomes None); latency keys like `p99_ttft_ms`."""
        out: dict[str, float | int | None] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, Stats):
                out[f.name] = value
        for name in _LATENCIES:
            stats: Stats = getattr(self, name)
            for stat in _LATENCY_STATS:
                out[f"{stat}_{name}_ms"] = getattr(stats, stat) * 1000.0
        for stat in _QOE_STATS:
            out[f"{stat}_qoe"] = getattr(self.qoe, stat)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def pooled_itls(records: Sequence[RequestRecord]) -> npt.NDArray[np.float64]:
    """All inter-token gaps of `records`, concatenated (vllm's pooled ITL)."""
    lengths = np.fromiter((len(r.token_times) for r in records), dtype=np.int64, count=len(records))
    total = int(lengths.sum())
    if total < 2:
        return np.empty(0)
    flat = np.fromiter(chain.from_iterable(r.token_times for r in records), float, count=total)
    gaps = np.diff(flat)
    keep = np.ones(total - 1, dtype=bool)
    ends = np.cumsum(lengths)[:-1] - 1  # last token of every record but the last
    keep[ends[(ends >= 0) & (ends < total - 1)]] = False
    return gaps[keep]


def _default_duration(records: Sequence[RequestRecord]) -> float:
    last = max((r.token_times[-1] for r in records if r.token_times), default=None)
    if last is None or not records:
        return 0.0
    return last - min(r.arrival_time for r in records)


def _rate(count: float, duration: float) -> float:
    return count / duration if duration > 0 else 0.0


def _values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    fn = {"ttft": ttft, "tpot": tpot, "e2el": e2el}[metric]
    return [v for v in map(fn, records) if v is not None]


def _count_good(records: Sequence[RequestRecord], thresholds: Mapping[str, float] | None) -> int:
    if thresholds is None:
        return sum(1 for r in records if is_good_by_slo(r))
    checked = check_goodput_thresholds(thresholds)
    return sum(1 for r in records if is_good(r, **checked))


def first_rejections(records: Sequence[RequestRecord]) -> tuple[str, ...]:
    """"request_id: reason" of the first `NUM_FIRST_REJECTIONS` rejected records."""
    rejected = (r for r in records if r.is_rejected)
    return tuple(f"{r.request_id}: {r.rejection_reason or 'no reason given'}"
                 for r, _ in zip(rejected, range(NUM_FIRST_REJECTIONS), strict=False))


def summarize(
    records: Sequence[RequestRecord],
    duration: float | None = None,
    goodput_thresholds: Mapping[str, float] | None = None,
    now: float | None = None,
    qoe_threshold: float = 0.95,
    default_ttft: float = DEFAULT_TTFT_TARGET,
    default_tds: float = DEFAULT_TDS,
) -> Summary:
    """Summarize a run.

    duration: seconds of the run; default last token time - first arrival.
    goodput_thresholds: {"ttft"|"tpot"|"e2el": seconds} as `--goodput`; None judges each
    request by its own SLO. now: when in-flight requests are judged; default first
    arrival + duration.
    """
    if duration is None:
        duration = _default_duration(records)
    elif not duration > 0:
        raise ValueError(f"duration must be > 0, got {duration!r}")
    if now is None and records:
        now = min(r.arrival_time for r in records) + duration
    done = [r for r in records if r.is_completed]
    num_aborted = sum(1 for r in records if r.is_aborted)
    num_in = sum(r.num_prompt_tokens for r in done)
    num_out = sum(r.num_output_tokens for r in done)
    qoes = qoe_all(records, now, default_ttft, default_tds)
    num_good = _count_good(records, goodput_thresholds)
    n = len(records)
    return Summary(
        num_requests=n,
        num_finished=len(done),
        num_aborted=num_aborted,
        num_unfinished=n - len(done) - num_aborted,
        num_truncated=sum(1 for r in done if r.is_truncated),
        num_rejected=sum(1 for r in records if r.is_rejected),
        first_rejections=first_rejections(records),
        duration=duration,
        total_input_tokens=num_in,
        total_output_tokens=num_out,
        request_throughput=_rate(len(done), duration),
        output_throughput=_rate(num_out, duration),
        total_token_throughput=_rate(num_in + num_out, duration),
        ttft=percentiles(_values(done, "ttft")),
        tpot=percentiles(_values(done, "tpot")),
        itl=percentiles(pooled_itls(done)),
        e2el=percentiles(_values(done, "e2el")),
        qoe=percentiles(qoes),
        qoe_threshold=qoe_threshold,
        qoe_attainment=sum(1 for q in qoes if q >= qoe_threshold) / n if n else math.nan,
        slo_attainment=sum(1 for r in records if meets_slo(r)) / n if n else math.nan,
        num_good=num_good,
        request_goodput=_rate(num_good, duration),
        mean_preemptions=sum(r.num_preemptions for r in records) / n if n else math.nan,
    )
