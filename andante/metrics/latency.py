"""Per-request latency metrics, defined exactly as `vllm bench serve` defines them.

ttft: arrival (client send) to the first token.
tpot: (e2el - ttft) / (output_tokens - 1), only when output_tokens > 1.
itls: gaps between consecutive tokens (pooled over requests by the summary).
e2el: arrival to the last token.
All in seconds; None where the request has not produced the tokens the metric needs.
"""

from __future__ import annotations

from andante.metrics.record import RequestRecord


def ttft(record: RequestRecord) -> float | None:
    if not record.token_times:
        return None
    return record.token_times[0] - record.arrival_time


def e2el(record: RequestRecord) -> float | None:
    if not record.token_times:
        return None
    return record.token_times[-1] - record.arrival_time


def tpot(record: RequestRecord) -> float | None:
    """Mean time per output token after the first; None unless > 1 token."""
    times = record.token_times
    n = len(times)
    if n < 2:
        return None
    return (times[-1] - times[0]) / (n - 1)


def itls(record: RequestRecord) -> list[float]:
    """Inter-token latencies: n - 1 gaps for n tokens."""
    times = record.token_times
    return [b - a for a, b in zip(times, times[1:], strict=False)]
