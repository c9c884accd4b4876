"""Metrics as pure functions of request timelines (DESIGN.md §5).

ttft / tpot / itl / e2el as `vllm bench serve`; Andes QoE (final or mid-flight);
per-request SLO checks, SLO attainment and goodput; run summaries and tables.
"""

from andante.metrics.latency import e2el, itls, tpot, ttft
from andante.metrics.qoe import DEFAULT_TDS, DEFAULT_TTFT_TARGET, qoe, qoe_all, qoe_of, qoe_params
from andante.metrics.record import ABORTED_REASONS, RequestRecord, records_from_requests
from andante.metrics.slo import (
    GOODPUT_METRICS,
    has_slo,
    is_good,
    is_good_by_slo,
    meets_deadline,
    meets_slo,
    meets_tbt,
    meets_ttft,
)
from andante.metrics.stats import RunningMean, Stats, percentiles
from andante.metrics.summary import Summary, SummaryStream, pooled_itls, summarize
from andante.metrics.table import DEFAULT_ROWS, format_table

__all__ = [
    "ABORTED_REASONS",
    "DEFAULT_ROWS",
    "DEFAULT_TDS",
    "DEFAULT_TTFT_TARGET",
    "GOODPUT_METRICS",
    "RequestRecord",
    "RunningMean",
    "Stats",
    "Summary",
    "SummaryStream",
    "e2el",
    "format_table",
    "has_slo",
    "is_good",
    "is_good_by_slo",
    "itls",
    "meets_deadline",
    "meets_slo",
    "meets_tbt",
    "meets_ttft",
    "percentiles",
    "pooled_itls",
    "qoe",
    "qoe_all",
    "qoe_of",
    "qoe_params",
    "records_from_requests",
    "summarize",
    "tpot",
    "ttft",
]
