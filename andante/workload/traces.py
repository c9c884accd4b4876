"""Replay of request traces (CSV or JSONL; the formats of `andante.workload.formats`).

Arrival times are seconds since the trace's earliest timestamp, divided by `rate_scale`
(rate_scale = 2 replays the trace twice as fast: double the request rate, half the span).
Timestamps are parsed exactly, with integer nanoseconds, from ISO-like text with any
number of fraction digits ('2023-11-16 18:15:46.6805900' has seven, more than
`datetime` accepts), an optional 'T' separator and an optional 'Z' or ±HH:MM offset; a
numeric time column is read in its format's unit (seconds unless stated). Rows are sorted
by time (stable) if the file is not.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from andante.workload._csv import to_int_array
from andante.workload.formats import TIME_UNITS, TraceColumns, read_prefix_ids, read_trace_table

_TIMESTAMP = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?\s*(Z|[+-]\d{2}:?\d{2})?$"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A replayable trace: arrival times (s from 0, sorted) and per-request lengths.

    num_rows: rows read from the file (before any cut to a count or duration);
    format: the name of the columns' format ("azure", "mooncake", ..., "custom");
    prefix_ids: each request's block content ids (Mooncake's hash_ids), of
    `prefix_span` tokens each; None if the trace has none;
    num_zero_token_rows: replayed rows with 0 prompt or output tokens, run as 1 token
    (a request needs a prompt token and produces at least one)."""

    arrival_times: np.ndarray
    prompt_lens: np.ndarray
    output_lens: np.ndarray
    source: str = ""
    num_rows: int = 0
    format: str = ""
    prefix_ids: tuple[tuple[int, ...], ...] | None = None
    prefix_span: int = 0
    num_zero_token_rows: int = 0

    def __len__(self) -> int:
        return len(self.arrival_times)

    @property
    def span(self) -> float:
        """Seconds from the first to the last arrival (0 for fewer than two)."""
        if len(self.arrival_times) < 2:
            return 0.0
        return float(self.arrival_times[-1] - self.arrival_times[0])


def parse_timestamp_ns(text: str) -> int:
    """Nanoseconds since the Unix epoch (UTC unless the text carries an offset).

    Raises ValueError with the offending text if it is neither a timestamp nor a number.
    """
    match = _TIMESTAMP.match(text.strip())
    if match is None:
        try:
            seconds = float(text)
        except ValueError:
            raise ValueError(f"unparseable timestamp {text!r}") from None
        if not math.isfinite(seconds):
            raise ValueError(f"unparseable timestamp {text!r}")
        return round(seconds * _NS_PER_S)
    day, clock, fraction, zone = match.groups()
    tz = "+00:00" if zone in (None, "Z") else zone
    try:
        moment = datetime.fromisoformat(f"{day}T{clock}{tz}")
    except ValueError:
        raise ValueError(f"unparseable timestamp {text!r}") from None
    whole = (moment - _EPOCH) // timedelta(seconds=1)
    nanos = int((fraction or "0")[:9].ljust(9, "0"))
    return whole * _NS_PER_S + nanos


def _offsets_seconds(path: Path, column: str, unit: str, texts: list[str]) -> np.ndarray:
    """Seconds since the earliest time of a column of numbers (in `unit`) or date-times."""
    try:
        numbers = np.array(texts, dtype=np.float64)
    except ValueError:
        numbers = None
    if numbers is not None:
        if not np.all(np.isfinite(numbers)):
            raise ValueError(f"{path}: column {column} has a non-finite time")
        return (numbers - numbers.min()) * TIME_UNITS[unit]
    stamps: list[int] = []
    for row_number, text in enumerate(texts, start=1):
        try:
            stamps.append(parse_timestamp_ns(text))
        except ValueError as exc:
            raise ValueError(f"{path}: column {column}, data row {row_number}: {exc}") from None
    first = min(stamps)
    return np.array([stamp - first for stamp in stamps], dtype=np.int64) / _NS_PER_S


def _check_cuts(rate_scale: float, max_requests: int | None, max_duration: float | None) -> None:
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ValueError(f"rate_scale must be a positive finite number, got {rate_scale!r}")
    if max_requests is not None and max_requests < 0:
        raise ValueError(f"max_requests must be >= 0, got {max_requests!r}")
    if max_duration is not None and not max_duration >= 0:
        raise ValueError(f"max_duration must be >= 0, got {max_duration!r}")


def load_trace(
    path: str | Path,
    rate_scale: float = 1.0,
    max_requests: int | None = None,
    max_duration: float | None = None,
    columns: TraceColumns | None = None,
) -> Trace:
    """Read a trace (columns recognised by name unless `columns` maps them) and return its
    (rate-scaled) arrivals and lengths.

    max_duration: keep arrivals at or before this many seconds of the *scaled* timeline;
    max_requests: then keep the first this many. Token counts below 1 are raised to 1
    (a request needs a prompt token and produces at least one token) and the rows so
    raised are counted (`Trace.num_zero_token_rows`).
    """
    file = Path(path)
    _check_cuts(rate_scale, max_requests, max_duration)
    used, table = read_trace_table(file, columns, need_time=True)
    time_column = used.time
    assert time_column is not None  # need_time=True
    times = _offsets_seconds(file, time_column, used.unit, table[time_column]) / rate_scale
    prompts = to_int_array(file, used.prompt, table[used.prompt])
    outputs = to_int_array(file, used.output, table[used.output])
    order = np.argsort(times, kind="stable")
    times, prompts, outputs = times[order], prompts[order], outputs[order]
    keep = len(times)
    if max_duration is not None:
        keep = int(np.searchsorted(times, max_duration, side="right"))
    if max_requests is not None:
        keep = min(keep, max_requests)
    ids = read_prefix_ids(file, used)
    zero = int(np.count_nonzero((prompts[:keep] < 1) | (outputs[:keep] < 1)))
    return Trace(
        arrival_times=times[:keep],
        prompt_lens=np.maximum(prompts[:keep], 1),
        output_lens=np.maximum(outputs[:keep], 1),
        source=str(file),
        num_rows=len(times),
        format=used.name,
        prefix_ids=None if ids is None else tuple(ids[i] for i in order[:keep]),
        prefix_span=used.prefix_span,
        num_zero_token_rows=zero,
    )
