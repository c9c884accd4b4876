"""Plain-text table of several runs' summaries side by side (one column per run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from andante.metrics.summary import Summary

#: (key of Summary.to_dict(), row label, format spec) in display order.
DEFAULT_ROWS: tuple[tuple[str, str, str], ...] = (
    ("num_requests", "requests", "d"),
    ("num_finished", "completed", "d"),
    ("num_truncated", "  of which truncated", "d"),
    ("num_aborted", "aborted", "d"),
    ("num_rejected", "  of which rejected", "d"),
    ("num_unfinished", "unfinished", "d"),
    ("duration", "duration (s)", ".2f"),
    ("request_throughput", "throughput (req/s)", ".3f"),
    ("output_throughput", "output (tok/s)", ".1f"),
    ("mean_ttft_ms", "TTFT mean (ms)", ".1f"),
    ("median_ttft_ms", "TTFT median (ms)", ".1f"),
    ("p99_ttft_ms", "TTFT p99 (ms)", ".1f"),
    ("mean_tpot_ms", "TPOT mean (ms)", ".2f"),
    ("p99_tpot_ms", "TPOT p99 (ms)", ".2f"),
    ("mean_itl_ms", "ITL mean (ms)", ".2f"),
    ("p99_itl_ms", "ITL p99 (ms)", ".2f"),
    ("mean_e2el_ms", "E2EL mean (ms)", ".1f"),
    ("p99_e2el_ms", "E2EL p99 (ms)", ".1f"),
    ("mean_qoe", "QoE mean", ".3f"),
    ("p10_qoe", "QoE p10", ".3f"),
    ("qoe_attainment", "QoE >= threshold", ".3f"),
    ("slo_attainment", "SLO attainment", ".3f"),
    ("request_goodput", "goodput (req/s)", ".3f"),
    ("mean_preemptions", "preemptions/req", ".2f"),
    ("prefix_cache_hit_rate", "prefix-cache hit rate", ".3f"),
    ("saved_prefill_tokens", "prefill tokens saved", "d"),
)


def _cell(value: float | int | None, spec: str) -> str:
    if value is None:
        return "-"
    if spec == "d":
        return str(int(value))
    return format(value, spec)


def format_table(
    summaries: Mapping[str, Summary],
    rows: Sequence[tuple[str, str, str]] = DEFAULT_ROWS,
) -> str:
    """One row per metric, one right-aligned column per run (e.g. per policy)."""
    names = list(summaries)
    dicts = [summaries[name].to_dict() for name in names]
    body = [[label, *(_cell(d.get(key), spec) for d in dicts)] for key, label, spec in rows]
    header = ["metric", *names]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in body)])
