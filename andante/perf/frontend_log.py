"""Fit a served engine's front end from its step log's request records.

Design note. A served request's TTFT pays, besides its queueing and its steps (which the
step records and the simulator's engine cover), the server around the engine: the HTTP
request parsed, its prompt tokenized, the hop to the engine (vLLM: another process);
then from the engine's first token to the first byte the client reads, the hop back,
detokenization and the SSE write. A simulator fed only the engine's steps predicts TTFT
low by that much (issue 31: about 90 ms on vLLM CPU serving SmolLM2). Two record kinds
in the same log measure it, each written by the served side, never by a client:

- `{"kind": "request", "id", "arrival", "seen", "idle", "first_token", "origin"}`, by
  the engine (andante's `serve --trace-steps`, andante.runtime.step_trace; vLLM with
  andante's scheduler class): when the server stamped the request (`arrival`), when the
  engine took it in (`seen`; `idle`: whether it had no work then), when the engine
  emitted its first token (`first_token`, null if none); `origin` (default 0) is the
  wall time of that clock's zero;
- `{"kind": "http", "id", "received", "first_byte"}`, written by the HTTP timing
  middleware (andante.server.http_timing) in wall seconds, for streamed responses:
  when the request reached the app and when its first body byte (its first SSE event)
  was sent; `id` is the response's id, the engine's request id or its prefix.

A request record matched to an http record (same id, or the engine's id is the http id
and a suffix, as vLLM adds one) gives both sides: `frontend_in` = seen - received,
`frontend_out` = first_byte - first_token. `frontend_in` is taken over the requests
that found the engine idle (`idle`, where the record says): an engine busy with a step
takes a new request in only at the step's end, a wait the simulator's engine has of its
own (on vLLM CPU under load it was most of a second: counting it would double it).
Without http records the engine's own records still give `frontend_in` from `seen -
arrival` (the server's stamp, taken after HTTP parsing and, on andante's server,
tokenization: a lower bound) and `frontend_out` is assumed 0; without request records
both are 0 (`FrontendFit.note` says what was assumed). The profile keeps the means: TTFT
is compared by its mean, and a constant added to every request moves the mean by exactly
that constant.

Records of these kinds that lack a field, carry a non-number or an interval that runs
backwards (beyond CLOCK_SLACK, two processes' reads of one wall clock) are a
`FrontendLogError` naming the line: a malformed record is refused, never skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andante.perf.step_log import StepLogError

REQUEST_KIND = "request"
HTTP_KIND = "http"
CLOCK_SLACK = 1e-3  # seconds an interval may run backwards between two processes
MAX_ID_SUFFIXES = 2  # '-suffix' parts an engine's id may add to the response's id


class FrontendLogError(StepLogError):
    """A request or http record of a step log that cannot be read."""


@dataclass(frozen=True, slots=True)
class EngineSide:
    """One request as the engine saw it, in wall seconds."""

    request_id: str
    arrival: float
    seen: float
    first_token: float | None
    line: int
    idle: bool | None = None  # the engine was idle when it took the request in


@dataclass(frozen=True, slots=True)
class HttpSide:
    """One streamed response as the HTTP layer saw it, in wall seconds."""

    request_id: str
    received: float
    first_byte: float | None
    line: int


@dataclass(frozen=True, slots=True)
class FrontendFit:
    """The front end's mean seconds before and after the engine, and on what."""

    frontend_in: float
    frontend_out: float
    num_requests: int  # request records read
    num_matched: int  # of them, matched to an http record with both first times
    note: str | None = None  # what was assumed, where the log lacked records


def _number(record: dict[str, Any], name: str, line: int, optional: bool = False
            ) -> float | None:
    value = record.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        kind = record.get("kind")
        raise FrontendLogError(f"line {line}: a {kind} record needs {name!r} as a number "
                               f"of seconds, got {value!r}")
    return float(value)


def _identifier(record: dict[str, Any], line: int) -> str:
    value = record.get("id")
    if not isinstance(value, str) or not value:
        raise FrontendLogError(f"line {line}: a {record.get('kind')} record needs its "
                               f"request 'id' as a string, got {value!r}")
    return value


def _in_order(earlier: float, later: float, what: str, line: int) -> None:
    if later < earlier - CLOCK_SLACK:
        raise FrontendLogError(f"line {line}: {what} runs backwards "
                               f"({(later - earlier) * 1e3:.1f} ms)")


def engine_side(record: dict[str, Any], line: int) -> EngineSide:
    origin = _number(record, "origin", line, optional=True) or 0.0
    arrival = _number(record, "arrival", line)
    seen = _number(record, "seen", line)
    first = _number(record, "first_token", line, optional=True)
    assert arrival is not None and seen is not None
    _in_order(arrival, seen, "arrival to seen", line)
    if first is not None:
        _in_order(seen, first, "seen to first_token", line)
    idle = record.get("idle")
    if idle is not None and not isinstance(idle, bool):
        raise FrontendLogError(f"line {line}: a request record's 'idle' must be true, "
                               f"false or null, got {idle!r}")
    return EngineSide(_identifier(record, line), arrival + origin, seen + origin,
                      None if first is None else first + origin, line, idle)


def http_side(record: dict[str, Any], line: int) -> HttpSide:
    received = _number(record, "received", line)
    first = _number(record, "first_byte", line, optional=True)
    assert received is not None
    if first is not None:
        _in_order(received, first, "received to first_byte", line)
    return HttpSide(_identifier(record, line), received, first, line)


def parse_frontend(lines: Iterable[str]) -> tuple[list[EngineSide], list[HttpSide]]:
    """The request and http records of a log's lines (other kinds skipped; a line that
    is not a JSON object is the step reader's to refuse)."""
    engine: list[EngineSide] = []
    http: list[HttpSide] = []
    for number, text in enumerate(lines, start=1):
        if '"request"' not in text and '"http"' not in text:
            continue  # most lines are steps: skip them without parsing
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        kind = record.get("kind")
        if kind == REQUEST_KIND and "seen" in record:
            if record.get("seen") is None:  # andante's trace: a request refused unseen
                continue
            engine.append(engine_side(record, number))
        elif kind == REQUEST_KIND:
            raise FrontendLogError(f"line {number}: a request record needs 'seen' (when "
                                   "the engine took the request in)")
        elif kind == HTTP_KIND:
            http.append(http_side(record, number))
    return engine, http


def read_frontend(path: str | Path) -> FrontendFit:
    """`fit_frontend` of the log file `path` (FrontendLogError if a record is malformed)."""
    try:
        with open(path, encoding="utf-8") as log:
            return fit_frontend(*parse_frontend(log))
    except OSError as exc:
        raise StepLogError(f"cannot read step log {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise StepLogError(f"step log {path} is not UTF-8 text") from None


def _match(engine: list[EngineSide], http: list[HttpSide]
           ) -> list[tuple[EngineSide, HttpSide]]:
    """Pairs of one request's two sides: the same id, or the engine's id is the http
    id followed by up to MAX_ID_SUFFIXES '-suffix' parts (vLLM's internal ids add the
    prompt's index and a random tag to the response's id)."""
    by_id = {h.request_id: h for h in http}
    pairs = []
    for e in engine:
        rid, h = e.request_id, by_id.get(e.request_id)
        for _ in range(MAX_ID_SUFFIXES):
            if h is not None or "-" not in rid:
                break
            rid = rid.rsplit("-", 1)[0]
            h = by_id.get(rid)
        if h is not None:
            pairs.append((e, h))
    return pairs


def _after(engine: EngineSide, http: HttpSide) -> float:
    """Seconds from the engine's first token to the first byte sent."""
    assert engine.first_token is not None and http.first_byte is not None
    return http.first_byte - engine.first_token


def fit_frontend(engine: list[EngineSide], http: list[HttpSide]) -> FrontendFit:
    """The means of the module note; FrontendLogError where matched sides contradict
    each other (the engine saw a request before the server received it)."""
    if not engine:
        return FrontendFit(0.0, 0.0, 0, 0, "the log has no request records: the front "
                           "end (HTTP, tokenization, streaming) was assumed to take 0 s")
    pairs = [(e, h) for e, h in _match(engine, http)
             if e.first_token is not None and h.first_byte is not None]
    if not pairs:
        alone = [e for e in engine if e.idle is not False] or engine
        before = sum(e.seen - e.arrival for e in alone) / len(alone)
        return FrontendFit(max(0.0, before), 0.0, len(engine), 0,
                           "no http records matched the request records: the time "
                           "before the engine is the engine's own (from the server's "
                           "stamp), the time after it was assumed to take 0 s")
    for e, h in pairs:
        _in_order(h.received, e.seen, f"request {e.request_id}: received to seen "
                  f"(http line {h.line})", e.line)
        assert e.first_token is not None and h.first_byte is not None
        _in_order(e.first_token, h.first_byte, f"request {e.request_id}: first_token to "
                  f"first_byte (http line {h.line})", e.line)
    into, note = _before(pairs)
    out = sum(_after(e, h) for e, h in pairs) / len(pairs)
    return FrontendFit(max(0.0, into), max(0.0, out), len(engine), len(pairs), note)


def _before(pairs: list[tuple[EngineSide, HttpSide]]) -> tuple[float, str | None]:
    """The mean time before the engine, over the requests that found it idle: one that
    came while a step ran was taken in at the step's end, a wait the simulator's engine
    already has (and under load, far longer than the front end's own time)."""
    idle = [(e, h) for e, h in pairs if e.idle is not False]
    note = None
    if not idle:
        idle = pairs
        note = ("no request found the engine idle: the time before the engine includes "
                "waits for steps to end (an overestimate); record under a lighter load")
    return sum(e.seen - h.received for e, h in idle) / len(idle), note
