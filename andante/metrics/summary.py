"""A run's summary: throughput, latency distributions, QoE, SLO attainment and goodput.

Latency, token and throughput figures follow `vllm bench serve`: they are taken over
completed requests only. QoE, SLO attainment, preemptions and the prefix cache's hit
rate and saved prefill tokens are taken over every request; a request still in flight
is judged at `now` (its QoE mid-flight).
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import chain

import numpy as np
import numpy.typing as npt

from andante.metrics.latency import e2el, tpot, ttft
from andante.metrics.qoe import DEFAULT_TDS, DEFAULT_TTFT_TARGET, final_qoe, qoe_all
from andante.metrics.record import RequestRecord
from andante.metrics.sketch import LogHistogram, Moments, sketched_stats
from andante.metrics.slo import check_goodput_thresholds, is_good, is_good_by_slo, meets_slo
from andante.metrics.stats import Stats, percentiles
from andante.metrics.table import format_table

__all__ = ["Stats", "Summary", "SummaryStream", "format_table", "percentiles", "pooled_itls",
           "summarize"]

_LATENCIES = ("ttft", "tpot", "itl", "e2el")
_LATENCY_STATS = ("mean", "median", "std", "p90", "p99")
_QOE_STATS = ("mean", "median", "p10", "min")
NUM_FIRST_REJECTIONS = 3
#: A streamed summary folds buffered token times into its ITL sketch once this many
#: tokens wait, so numpy runs on large arrays yet the buffer stays bounded.
ITL_FOLD_TOKENS = 1 << 16


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
    prefix_cache_hit_rate: float = math.nan  # hit / queried tokens (nan: no query)
    saved_prefill_tokens: int = 0  # prompt tokens found in the prefix cache

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
    return _pooled_gaps([r.token_times for r in records])


def _pooled_gaps(streams: Sequence[Sequence[float]]) -> npt.NDArray[np.float64]:
    """The gaps within each of `streams` (none across two), concatenated: one np.diff
    over all of them, so the values equal each stream's own np.diff bit for bit."""
    lengths = np.fromiter((len(t) for t in streams), dtype=np.int64, count=len(streams))
    total = int(lengths.sum())
    if total < 2:
        return np.empty(0)
    flat = np.fromiter(chain.from_iterable(streams), float, count=total)
    gaps = np.diff(flat)
    keep = np.ones(total - 1, dtype=bool)
    ends = np.cumsum(lengths)[:-1] - 1  # last token of every stream but the last
    keep[ends[(ends >= 0) & (ends < total - 1)]] = False
    return gaps[keep]


def _rate(count: float, duration: float) -> float:
    return count / duration if duration > 0 else 0.0


def _ratio(count: int, total: int) -> float:
    return count / total if total else math.nan


def _float_stats(values: array[float]) -> Stats:
    return percentiles(np.frombuffer(values, dtype=np.float64) if len(values) else [])


@dataclass(slots=True)
class _Counts:
    requests: int = 0
    completed: int = 0
    aborted: int = 0
    rejected: int = 0
    truncated: int = 0
    good: int = 0
    slo_met: int = 0
    preemptions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0


class SummaryStream:
    """A `Summary` built one record at a time (see `summarize` for the figures).

    exact=True keeps what `summarize` keeps (every inter-token gap, every record until
    `summary`) and gives exactly its figures. exact=False bounds memory by the number of
    requests (8-byte floats per request): the pooled ITL percentiles come from a
    `LogHistogram` (relative error at most `ITL_RELATIVE_ERROR`; its count, mean, std,
    min and max stay exact; the token times of completed records wait in a buffer of at
    most `ITL_FOLD_TOKENS` and are folded into it a batch at a time, which changes the
    mean and std only by float rounding), and a finished record is judged as soon as
    the clock (the latest token or arrival of a finished record) passes its reader's last
    consumption, after which its QoE at any later `now` is final; records whose reader
    is still behind wait for `summary`, which then needs `now` >= that clock.
    """

    def __init__(
        self,
        goodput_thresholds: Mapping[str, float] | None = None,
        exact: bool = False,
        qoe_threshold: float = 0.95,
        default_ttft: float = DEFAULT_TTFT_TARGET,
        default_tds: float = DEFAULT_TDS,
    ) -> None:
        self._thresholds = (None if goodput_thresholds is None
                            else check_goodput_thresholds(goodput_thresholds))
        self._exact = exact
        self._qoe_args = (default_ttft, default_tds)
        self.qoe_threshold = qoe_threshold
        self._init_aggregates()

    def _init_aggregates(self) -> None:
        self._counts = _Counts()
        self._latencies = {name: array("d") for name in ("ttft", "tpot", "e2el")}
        self._qoes = array("d")
        # token times of completed streams whose gaps are not yet taken (exact: all of
        # them, until `summary`; else at most ITL_FOLD_TOKENS, then folded in the sketch)
        self._itl_streams: list[Sequence[float]] = []
        self._itl_tokens = 0
        self._itl_moments = Moments()
        self._itl_histogram = LogHistogram()
        # heap by reader end: (end, order, record, its final QoE once finished)
        self._unjudged: list[tuple[float, int, RequestRecord, float]] = []
        self._rejections: list[str] = []
        self.first_arrival = math.inf
        self.last_token = -math.inf
        self.clock = -math.inf

    def add(self, record: RequestRecord) -> None:
        """Count one request (finished, or still in flight at the end of a run)."""
        c = self._counts
        c.requests += 1
        c.preemptions += record.num_preemptions
        c.prefix_query_tokens += record.num_prefix_query_tokens
        c.prefix_hit_tokens += record.num_prefix_hit_tokens
        c.good += self._is_good(record)
        c.slo_met += meets_slo(record)
        if record.is_completed:
            self._add_completed(record)
        elif record.is_aborted:
            c.aborted += 1
            if record.is_rejected:
                c.rejected += 1
                if len(self._rejections) < NUM_FIRST_REJECTIONS:
                    reason = record.rejection_reason or "no reason given"
                    self._rejections.append(f"{record.request_id}: {reason}")
        self.first_arrival = min(self.first_arrival, record.arrival_time)
        if record.token_times:
            self.last_token = max(self.last_token, record.token_times[-1])
        if record.is_finished:
            self.clock = max(self.clock, self.last_token, record.arrival_time)
        self._judge(record)

    def _is_good(self, record: RequestRecord) -> bool:
        if self._thresholds is None:
            return is_good_by_slo(record)
        return is_good(record, **self._thresholds)

    def _add_completed(self, record: RequestRecord) -> None:
        c = self._counts
        c.completed += 1
        c.truncated += record.is_truncated
        c.input_tokens += record.num_prompt_tokens
        c.output_tokens += record.num_output_tokens
        for name, fn in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
            value = fn(record)
            if value is not None:
                self._latencies[name].append(value)
        if len(record.token_times) > 1:
            self._itl_streams.append(record.token_times)
            self._itl_tokens += len(record.token_times)
            if not self._exact and self._itl_tokens >= ITL_FOLD_TOKENS:
                self._fold_itls()

    def _fold_itls(self) -> None:
        """Move the buffered streams' gaps into the sketch (moments and histogram)."""
        if self._itl_streams:
            gaps = _pooled_gaps(self._itl_streams)
            self._itl_moments.add(gaps)
            self._itl_histogram.add(gaps)
        self._itl_streams = []
        self._itl_tokens = 0

    def _judge(self, record: RequestRecord) -> None:
        """Fix the QoE of the records whose reader is done by the clock; hold the rest."""
        unjudged = self._unjudged
        if self._exact or not record.is_finished:
            heapq.heappush(unjudged, (math.inf, self._counts.requests, record, math.nan))
            return
        value, done = final_qoe(record, *self._qoe_args)
        if done <= self.clock:
            self._qoes.append(value)
        else:
            heapq.heappush(unjudged, (done, self._counts.requests, record, value))
        while unjudged and unjudged[0][0] <= self.clock:
            self._qoes.append(heapq.heappop(unjudged)[3])  # final: computed when pushed

    def _itl_stats(self) -> Stats:
        if self._exact:
            return percentiles(_pooled_gaps(self._itl_streams))
        self._fold_itls()
        return sketched_stats(self._itl_moments, self._itl_histogram)

    def summary(self, duration: float | None = None, now: float | None = None) -> Summary:
        """The figures so far. duration: seconds of the run, default last token time -
        first arrival; now: when unjudged and in-flight requests are judged, default
        first arrival + duration."""
        if duration is None:
            span = self.last_token - self.first_arrival
            duration = span if span > 0 else 0.0
        elif not duration > 0:
            raise ValueError(f"duration must be > 0, got {duration!r}")
        if now is None and self._counts.requests:
            now = self.first_arrival + duration
        if not self._exact and now is not None and now < self.clock:
            raise ValueError(f"now={now!r} precedes records already judged (up to {self.clock!r})")
        records = [item[2] for item in sorted(self._unjudged, key=lambda item: item[1])]
        qoes = np.concatenate([np.frombuffer(self._qoes, dtype=np.float64) if self._qoes
                               else np.empty(0),
                               np.array(qoe_all(records, now, *self._qoe_args), dtype=float)])
        return self._summary(duration, qoes)

    def _summary(self, duration: float, qoes: npt.NDArray[np.float64]) -> Summary:
        c = self._counts
        n = c.requests
        return Summary(
            num_requests=n,
            num_finished=c.completed,
            num_aborted=c.aborted,
            num_unfinished=n - c.completed - c.aborted,
            num_truncated=c.truncated,
            num_rejected=c.rejected,
            first_rejections=tuple(self._rejections),
            duration=duration,
            total_input_tokens=c.input_tokens,
            total_output_tokens=c.output_tokens,
            request_throughput=_rate(c.completed, duration),
            output_throughput=_rate(c.output_tokens, duration),
            total_token_throughput=_rate(c.input_tokens + c.output_tokens, duration),
            ttft=_float_stats(self._latencies["ttft"]),
            tpot=_float_stats(self._latencies["tpot"]),
            itl=self._itl_stats(),
            e2el=_float_stats(self._latencies["e2el"]),
            qoe=percentiles(qoes),
            qoe_threshold=self.qoe_threshold,
            qoe_attainment=_ratio(int(np.count_nonzero(qoes >= self.qoe_threshold)), n),
            slo_attainment=_ratio(c.slo_met, n),
            num_good=c.good,
            request_goodput=_rate(c.good, duration),
            mean_preemptions=_ratio(c.preemptions, n),
            prefix_cache_hit_rate=_ratio(c.prefix_hit_tokens, c.prefix_query_tokens),
            saved_prefill_tokens=c.prefix_hit_tokens,
        )


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
    stream = SummaryStream(goodput_thresholds, exact=True, qoe_threshold=qoe_threshold,
                           default_ttft=default_ttft, default_tds=default_tds)
    for record in records:
        stream.add(record)
    return stream.summary(duration, now)
