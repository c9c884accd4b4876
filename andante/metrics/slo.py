"""Per-request SLO checks and `vllm bench serve --goodput` semantics.

A request's own SLO (andante.core.SLO) may give a TTFT, a mean time between tokens
(tbt, compared with tpot, as Ascendra does) and an end-to-end deadline (QLM). An objective
that is not given is met; one that needs a token the request never produced is missed.
Thresholds are in seconds throughout.
"""

from __future__ import annotations

from collections.abc import Mapping

from andante.metrics.latency import e2el, tpot, ttft
from andante.metrics.record import RequestRecord

#: metric names accepted as goodput thresholds (as in `--goodput ttft:MS tpot:MS e2el:MS`).
GOODPUT_METRICS: frozenset[str] = frozenset({"ttft", "tpot", "e2el"})


def meets_ttft(record: RequestRecord) -> bool:
    target = record.slo.ttft
    if target is None:
        return True
    value = ttft(record)
    return value is not None and value <= target


def meets_tbt(record: RequestRecord) -> bool:
    """Mean time between tokens (tpot) within slo.tbt; vacuous with fewer than 2 tokens."""
    target = record.slo.tbt
    if target is None:
        return True
    value = tpot(record)
    return value is None or value <= target


def meets_deadline(record: RequestRecord) -> bool:
    """Completed, with its last token no later than arrival + slo.deadline."""
    target = record.slo.deadline
    if target is None:
        return True
    value = e2el(record)
    return record.is_completed and value is not None and value <= target


def has_slo(record: RequestRecord) -> bool:
    slo = record.slo
    return slo.ttft is not None or slo.tbt is not None or slo.deadline is not None


def meets_slo(record: RequestRecord) -> bool:
    """All objectives the request gives are met (a request without any counts as met)."""
    return meets_ttft(record) and meets_tbt(record) and meets_deadline(record)


def is_good(
    record: RequestRecord,
    ttft: float | None = None,
    tpot: float | None = None,
    e2el: float | None = None,
) -> bool:
    """`vllm bench serve --goodput` check with thresholds in seconds.

    Only completed requests with at least one token can be good; a one-token request's
    tpot counts as 0, as in vllm.
    """
    if not record.is_completed or not record.token_times:
        return False
    times = record.token_times
    first = times[0] - record.arrival_time
    last = times[-1] - record.arrival_time
    n = len(times)
    per_token = (last - first) / (n - 1) if n > 1 else 0.0
    return (
        (ttft is None or first <= ttft)
        and (tpot is None or per_token <= tpot)
        and (e2el is None or last <= e2el)
    )


def check_goodput_thresholds(thresholds: Mapping[str, float]) -> dict[str, float]:
    """Validate {metric: seconds}; raises ValueError naming the offending entry."""
    checked: dict[str, float] = {}
    for name, value in thresholds.items():
        if name not in GOODPUT_METRICS:
            raise ValueError(f"unknown goodput metric {name!r}; expected one of ttft/tpot/e2el")
        if not value > 0:
            raise ValueError(f"goodput threshold {name}={value!r} must be > 0")
        checked[name] = float(value)
    return checked


def is_good_by_slo(record: RequestRecord) -> bool:
    """Goodput against the request's own SLO: completed and meeting it."""
    return record.is_completed and bool(record.token_times) and meets_slo(record)
