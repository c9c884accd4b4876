"""Reference (slow, literal) QoE implementations the tests compare against."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from andante.metrics import RequestRecord

MakeRecord = Callable[..., RequestRecord]


def consumption(times: Sequence[float], tds: float) -> list[float]:
    """T_i^actual = max(arrival_i, T_{i-1}^actual + 1/tds)."""
    out: list[float] = []
    for t in times:
        out.append(t if not out else max(t, out[-1] + 1.0 / tds))
    return out


def paper_qoe(arrival: float, times: Sequence[float], ttft: float, tds: float) -> float:
    """Andes eq. 1-3 literally, for a finished stream."""
    actual = consumption(times, tds)
    ideal = [arrival + ttft + i / tds for i in range(len(times))]
    s_delay = sum(max(a - i, 0.0) for a, i in zip(actual, ideal, strict=True))
    s_whole = sum(actual[-1] - i for i in ideal)
    return 1.0 if s_whole <= 0 else 1.0 - s_delay / s_whole


def brute_qoe_at(
    arrival: float,
    times: Sequence[float],
    ttft: float,
    tds: float,
    now: float,
    num_tokens: int,
) -> float:
    """The mid-flight generalization, token by token (undelivered: T^actual = inf)."""
    actual = consumption(times, tds) + [math.inf] * (num_tokens - len(times))
    s_delay = s_whole = 0.0
    for i in range(num_tokens):
        ideal = arrival + ttft + i / tds
        if ideal > now:
            break
        s_delay += max(min(actual[i], now) - ideal, 0.0)
        s_whole += now - ideal
    return 1.0 if s_whole <= 0 else 1.0 - s_delay / s_whole
