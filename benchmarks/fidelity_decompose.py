"""Where a served request's TTFT goes, real and simulated, one part at a time (issue 31).

Real, from the step log's records of one request (vLLM running andante's scheduler
class, with the HTTP timing middleware: andante.perf.frontend_log):
- `to_engine`: the HTTP receipt to the scheduler's `add_request` (the front end, and
  for a request that came mid-step the wait for the step in flight: vLLM's engine core
  takes requests in between steps);
- `to_step`: from `add_request` to the start of the step that ran its prefill (a step
  record's start is its end `t` less its duration; the log's `t` is on the scheduler's
  clock, set against wall time by the request records' first token, which the
  scheduler stamps as it logs that step);
- `step`: that step's duration (its shape: how many decodes it carried);
- `to_first_byte`: the first token to the first byte out.
Simulated, from the requests' timelines (andante.sim): `to_engine` is the profile's
`frontend_in` plus the wait for the simulated step in flight, `to_step` 0 (the simulated
engine takes a request in when it plans a step), `step` the first token less the first
scheduling, `to_first_byte` the profile's `frontend_out`.
The client's own time (`client`, real only): the client's mean TTFT less the server's
(receipt to first byte), which a server's log cannot see.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from andante.core.request import Request

PARTS = ("to_engine", "to_step", "step", "to_first_byte")


@dataclass(frozen=True, slots=True)
class RealRequest:
    """One request's TTFT parts as the step log saw them (seconds)."""

    received: float
    idle: bool  # the engine had no request when the scheduler took it in
    parts: dict[str, float]
    num_decodes: int  # decodes in the step that ran its prefill

    @property
    def ttft(self) -> float:
        return sum(self.parts.values())


def _http_of(rid: str, http: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The HTTP record of engine request `rid` (its id, or a prefix of it: vLLM adds a
    suffix)."""
    return http.get(rid) or next((h for key, h in http.items() if rid.startswith(key)), None)


def real_requests(lines: Sequence[str]) -> list[RealRequest]:
    """The requests of `lines` (a step log's) with a request record and an HTTP record,
    in order of HTTP receipt: vLLM's (written at the first token, wall seconds; the step
    record after it ran the prefill) or andante's (`andante serve --trace-steps`: written
    at the end, on the engine's clock with its wall `origin`, with its first scheduling)."""
    records = [json.loads(line) for line in lines if line.strip()]
    http = {r["id"]: r for r in records if r.get("kind") == "http"}
    if any(r.get("kind") == "request" and "first_scheduled" in r for r in records):
        return _andante_requests(records, http)
    offsets, found = [], []
    for index, record in enumerate(records):
        if record.get("kind") != "request":
            continue
        step = next((r for r in records[index + 1:] if r.get("kind") == "step"), None)
        if step is None or step.get("t") is None:
            continue
        offsets.append(record["first_token"] - step["t"])
        match = _http_of(record["id"], http)
        if match is not None:
            found.append((record, step, match))
    if not offsets:
        return []
    origin = statistics.median(offsets)  # wall time less the scheduler's clock
    out = []
    for record, step, reply in found:
        start = origin + step["t"] - step["duration"]
        parts = {"to_engine": record["seen"] - reply["received"],
                 "to_step": start - record["seen"], "step": step["duration"],
                 "to_first_byte": reply["first_byte"] - (origin + step["t"])}
        out.append(RealRequest(reply["received"], bool(record["idle"]), parts,
                               int(step.get("num_decode_seqs", 0))))
    return sorted(out, key=lambda r: r.received)


def _andante_requests(records: list[dict[str, Any]], http: dict[str, dict[str, Any]]
                      ) -> list[RealRequest]:
    prefill_step: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.get("kind") == "step":
            for rid in record.get("prefill_ids") or ():
                prefill_step[rid] = record  # the last chunk's step
    out = []
    for record in records:
        if record.get("kind") != "request" or record.get("first_token") is None:
            continue
        reply, origin = _http_of(record["id"], http), record.get("origin", 0.0)
        if reply is None or record.get("seen") is None:
            continue
        scheduled, first = record["first_scheduled"], record["first_token"]
        parts = {"to_engine": origin + record["seen"] - reply["received"],
                 "to_step": scheduled - record["seen"], "step": first - scheduled,
                 "to_first_byte": reply["first_byte"] - (origin + first)}
        step = prefill_step.get(record["id"], {})
        out.append(RealRequest(reply["received"], bool(record.get("idle")), parts,
                               int(step.get("num_decode_seqs", 0))))
    return sorted(out, key=lambda r: r.received)


def simulated_parts(requests: Sequence[Request], frontend_out: float
                    ) -> list[dict[str, float]]:
    """Each simulated request's TTFT parts (the module note)."""
    out = []
    for req in requests:
        timeline = req.timeline
        if timeline.first_scheduled_time is None or not timeline.token_times:
            continue
        out.append({"to_engine": timeline.first_scheduled_time - req.arrival_time,
                    "to_step": 0.0,
                    "step": timeline.token_times[0] - timeline.first_scheduled_time,
                    "to_first_byte": frontend_out})
    return out


def _means_ms(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    if not parts:
        return {}
    return {name: round(1e3 * statistics.fmean(p[name] for p in parts), 1) for name in PARTS}


def decomposition(real: Sequence[RealRequest], sim: Sequence[dict[str, float]],
                  client_ttft_ms: float | None) -> dict[str, Any]:
    """Mean TTFT parts in ms, real and simulated, and the real requests that found the
    engine idle or busy apart; `client_ms`: the client's TTFT less the server's."""
    server_ms = 1e3 * statistics.fmean(r.ttft for r in real) if real else None
    out: dict[str, Any] = {
        "real": _means_ms([r.parts for r in real]), "sim": _means_ms(sim),
        "real_idle": _means_ms([r.parts for r in real if r.idle]),
        "real_busy": _means_ms([r.parts for r in real if not r.idle]),
        "num_real": len(real), "num_idle": sum(r.idle for r in real),
        "decodes_beside_prefill": round(statistics.fmean(r.num_decodes for r in real), 2)
        if real else None}
    if client_ttft_ms is not None and server_ms is not None:
        out["client_ms"] = round(client_ttft_ms - server_ms, 1)
    return out
