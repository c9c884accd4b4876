"""Andes' Quality-of-Experience of a text stream (Andes §3.1, eq. 1-3), also mid-flight.

Design note. The ideal consumption timeline is T_i^ideal = arrival + ttft_target +
(i - 1) / tds (tds: the reader's tokens/s). The reader cannot read ahead of the pace, so
the actual consumption timeline is T_i^actual = max(arrival_i, T_{i-1}^actual + 1/tds).
For a finished request with n tokens, S_delay = sum_i (T_i^actual - T_i^ideal)^+,
S_whole = sum_i (T_n^actual - T_i^ideal) and QoE = 1 - S_delay / S_whole (1 if
S_whole <= 0).

Mid-flight at time t the same quantities are taken over the tokens already due
(T_i^ideal <= t); a token not yet delivered by t has T^actual = +inf:
    S_delay(t) = sum_i (min(T_i^actual, t) - T_i^ideal)^+,
    S_whole(t) = sum_i (t - T_i^ideal)^+,
over i = 1.. (up to max_tokens when known). Once all max_tokens tokens are consumed the
value freezes at t = T_n^actual, where it equals eq. 1-3 exactly: if any token is late,
T_n^actual > T_n^ideal, so no term of S_whole is negative. A queued request past its
TTFT target therefore has QoE 0; a request before its target, or a perfect stream, 1.

Caveat of the paper's normalizer: for a finished request, delaying the *last* token
adds n * delta to S_whole but only delta to S_delay, so the final QoE of a badly late
stream can rise. At a fixed time t, QoE never rises when a token is delayed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from andante.core.sampling import DEFAULT_TDS, DEFAULT_TTFT_TARGET
from andante.metrics.record import RequestRecord

__all__ = ["DEFAULT_TDS", "DEFAULT_TTFT_TARGET", "final_qoe", "qoe", "qoe_all", "qoe_of",
           "qoe_params"]

#: Streams at least this long use the numpy kernels (faster from about 64 tokens on).
NUMPY_MIN_TOKENS = 64


def qoe(
    arrival: float,
    token_times: Sequence[float],
    ttft_target: float = DEFAULT_TTFT_TARGET,
    tds: float = DEFAULT_TDS,
    now: float | None = None,
    max_tokens: int | None = None,
) -> float:
    """QoE in [0, 1] of one stream.

    now=None: the final value of a finished stream of len(token_times) tokens (0 if it
    has none). Otherwise the value at time `now` of a stream that may still produce
    tokens, up to `max_tokens` if given; tokens with times after `now` count as
    undelivered.
    """
    _check_params(ttft_target, tds)
    num_tokens = len(token_times)
    if max_tokens is not None and num_tokens > max_tokens:
        raise ValueError(f"{num_tokens} tokens exceed max_tokens={max_tokens}")
    start = arrival + ttft_target
    inv = 1.0 / tds
    if now is None:
        return _final_qoe(token_times, start, inv)[0] if num_tokens else 0.0
    if max_tokens is not None and num_tokens == max_tokens > 0:
        final, last_consumed = _final_qoe(token_times, start, inv)
        if now >= last_consumed:  # every token consumed: the value is final
            return final
    return _midflight_qoe(token_times, start, inv, now, max_tokens)


def _check_params(ttft_target: float, tds: float) -> None:
    if not (math.isfinite(tds) and tds > 0):
        raise ValueError(f"tds must be a positive finite number, got {tds!r}")
    if not (math.isfinite(ttft_target) and ttft_target >= 0):
        raise ValueError(f"ttft_target must be a finite number >= 0, got {ttft_target!r}")


def _final_qoe(times: Sequence[float], start: float, inv: float) -> tuple[float, float]:
    """Eq. 1-3 for a finished stream; also returns T_n^actual."""
    if len(times) >= NUMPY_MIN_TOKENS:
        return _final_qoe_np(times, start, inv)
    delay = 0.0
    prev = -math.inf
    for i, arrived in enumerate(times):
        consumed = prev + inv
        if arrived > consumed:
            consumed = arrived
        late = consumed - (start + i * inv)
        if late > 0.0:
            delay += late
        prev = consumed
    if delay <= 0.0:
        return 1.0, prev
    n = len(times)
    whole = n * (prev - start) - inv * n * (n - 1) / 2
    return _ratio(delay, whole), prev


def _midflight_qoe(
    times: Sequence[float], start: float, inv: float, now: float, max_tokens: int | None
) -> float:
    if now < start:
        return 1.0
    due = int((now - start) / inv) + 1  # tokens whose ideal time has passed
    if max_tokens is not None:
        due = min(due, max_tokens)
    elapsed = now - start
    whole = due * elapsed - inv * due * (due - 1) / 2
    if whole <= 0.0:
        return 1.0
    delivered = min(len(times), due)
    if delivered >= NUMPY_MIN_TOKENS:
        delay = _midflight_delay_np(times, delivered, start, inv, now)
    else:
        delay = _midflight_delay(times, delivered, start, inv, now)
    # tokens due but not delivered: each is late by (now - T_i^ideal)
    delay += (due - delivered) * elapsed - inv * (due * (due - 1) - delivered * (delivered - 1)) / 2
    return _ratio(delay, whole)


def _midflight_delay(
    times: Sequence[float], delivered: int, start: float, inv: float, now: float
) -> float:
    """S_delay(now) over the first `delivered` tokens."""
    delay = 0.0
    prev = -math.inf
    for i in range(delivered):
        consumed = prev + inv
        arrived = times[i]
        if arrived > consumed:
            consumed = arrived
        prev = consumed
        late = (consumed if consumed < now else now) - (start + i * inv)
        if late > 0.0:
            delay += late
    return delay


def _midflight_delay_np(
    times: Sequence[float], delivered: int, start: float, inv: float, now: float
) -> float:
    """Vectorized `_midflight_delay`: T_i^actual - (i-1)/tds is a running maximum."""
    offsets = np.arange(delivered) * inv
    arrived = np.fromiter(times, dtype=float, count=delivered)
    late = np.minimum(np.maximum.accumulate(arrived - offsets) - start, (now - start) - offsets)
    return float(late[late > 0.0].sum())


def _final_qoe_np(times: Sequence[float], start: float, inv: float) -> tuple[float, float]:
    """Vectorized `_final_qoe`."""
    n = len(times)
    offsets = np.arange(n) * inv
    late = np.maximum.accumulate(np.fromiter(times, dtype=float, count=n) - offsets) - start
    last_consumed = float(late[-1] + offsets[-1] + start)
    delay = float(late[late > 0.0].sum())
    if delay <= 0.0:
        return 1.0, last_consumed
    whole = n * (last_consumed - start) - inv * n * (n - 1) / 2
    return _ratio(delay, whole), last_consumed


def _ratio(delay: float, whole: float) -> float:
    if whole <= 0.0:
        return 1.0
    value = 1.0 - delay / whole
    return 0.0 if value < 0.0 else (1.0 if value > 1.0 else value)


def qoe_params(
    record: RequestRecord,
    default_ttft: float = DEFAULT_TTFT_TARGET,
    default_tds: float = DEFAULT_TDS,
) -> tuple[float, float]:
    """(ttft_target, tds) from the record's SLO, falling back to the defaults."""
    slo = record.slo
    ttft_target = slo.ttft if slo.ttft is not None else default_ttft
    tds = slo.tds if slo.tds is not None else default_tds
    return ttft_target, tds


def qoe_of(
    record: RequestRecord,
    now: float | None = None,
    default_ttft: float = DEFAULT_TTFT_TARGET,
    default_tds: float = DEFAULT_TDS,
) -> float:
    """QoE of a record: final once it is finished, else its value at `now`.

    A finished record is a stream of exactly its generated tokens (an aborted or
    rejected one with no token scores 0); `now` earlier than its last consumption gives
    the value at that time. An in-flight record needs `now`.
    """
    ttft_target, tds = qoe_params(record, default_ttft, default_tds)
    times = record.token_times
    if record.is_finished:
        if not times:
            return 0.0
        return qoe(record.arrival_time, times, ttft_target, tds, now, max_tokens=len(times))
    if now is None:
        raise ValueError(f"request {record.request_id!r} is in flight: pass `now`")
    return qoe(record.arrival_time, times, ttft_target, tds, now, record.max_tokens)


def final_qoe(
    record: RequestRecord,
    default_ttft: float = DEFAULT_TTFT_TARGET,
    default_tds: float = DEFAULT_TDS,
) -> tuple[float, float]:
    """(final QoE, T_n^actual) of a finished record: `qoe_of(record, now)` equals the
    final value for every `now` >= T_n^actual (-inf for a record without tokens)."""
    times = record.token_times
    if not times:
        return 0.0, -math.inf
    ttft_target, tds = qoe_params(record, default_ttft, default_tds)
    _check_params(ttft_target, tds)
    return _final_qoe(times, record.arrival_time + ttft_target, 1.0 / tds)


def qoe_all(
    records: Iterable[RequestRecord],
    now: float | None = None,
    default_ttft: float = DEFAULT_TTFT_TARGET,
    default_tds: float = DEFAULT_TDS,
) -> list[float]:
    """QoE of every record (in-flight ones at `now`)."""
    return [qoe_of(r, now, default_ttft, default_tds) for r in records]
