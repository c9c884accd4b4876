"""One client request on its way through the fleet: its body, its SLO, its events.

The body is forwarded as the client sent it, but for the SLO fields, rewritten for the
upstream's kind: a vLLM upstream (loading `andante.vllm`'s scheduler class) reads them
as `vllm_xargs` flat keys `ttft`, `tbt`, `tds`, `deadline` (seconds); an andante upstream
as its `slo` object; any other server gets neither (it would refuse unknown fields).

What the client gets is a series of events, in order (handed to `sink` where the front
sends them at once, else queued in `events`): `Chunk`s (the upstream's SSE bytes,
as they arrive) then `End`; or one `Full` answer (a whole non-streamed response, or an
upstream's refusal passed through); or a `Failure` made here (no upstream could serve
it, or the one serving it died after it had streamed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from andante.core.sampling import SLO

SLO_KEYS = ("ttft", "tbt", "tds", "deadline")


@dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes


@dataclass(frozen=True, slots=True)
class End:
    pass


@dataclass(frozen=True, slots=True)
class Full:
    status: int
    content_type: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Failure:
    status: int
    message: str
    code: str


Event = Chunk | End | Full | Failure


@dataclass(frozen=True, slots=True)
class Delivered:
    """Queued once the front's `sink` has sent the answer's end itself: whoever waits
    on `events` stops there (no event of the answer is left for it)."""


@dataclass(slots=True, eq=False)
class Call:
    """`deadline`: clock time after which the call is not retried any more."""

    request_id: str
    model: str
    path: str  # "/v1/chat/completions" or "/v1/completions"
    body: dict[str, Any]  # without andante's `slo` object
    slo: SLO
    stream: bool
    arrival: float
    deadline: float
    events: asyncio.Queue[Event | Delivered] = field(default_factory=asyncio.Queue)
    raw: bytes | None = None  # the body as the client sent it, when nothing is rewritten
    attempts: int = 0
    num_replaced: int = 0  # placed in a row where its model could not be served
    started: bool = False  # a byte reached the client: it cannot move any more
    finished: bool = False
    # delivers an event to the client at once (True), else it is queued in `events`
    sink: Callable[[Event], bool] | None = None

    def push(self, event: Event) -> None:
        if not isinstance(event, Chunk):
            self.finished = True
        if self.sink is None or not self.sink(event):
            self.events.put_nowait(event)

    def payload_for(self, kind: str) -> bytes:
        """The body's bytes for an upstream of `kind`: as the client sent them, if no
        field is rewritten (`raw`), else `body_for(kind)` serialized."""
        if self.raw is not None:
            return self.raw
        return json.dumps(self.body_for(kind), ensure_ascii=False,
                          separators=(",", ":")).encode()

    def body_for(self, kind: str) -> dict[str, Any]:
        """The body for an upstream of `kind` (see the module note)."""
        body = dict(self.body)
        targets = {k: getattr(self.slo, k) for k in SLO_KEYS if getattr(self.slo, k)}
        xargs = body.pop("vllm_xargs", None)
        if kind == "vllm":
            merged = {k: v for k, v in (xargs or {}).items() if k not in SLO_KEYS}
            merged.update(targets)
            if merged:
                body["vllm_xargs"] = merged
        elif kind == "andante" and targets:
            body["slo"] = targets
        return body


def slo_from(body: dict[str, Any], slo: SLO | None) -> SLO:
    """The request's SLO: andante's `slo` object (`slo`, already validated), else the
    flat `vllm_xargs` keys (ValueError naming a bad one)."""
    if slo is not None and any(getattr(slo, k) for k in SLO_KEYS):
        return slo
    xargs = body.get("vllm_xargs")
    if not isinstance(xargs, dict):
        return slo or SLO()
    values: dict[str, float] = {}
    for key in SLO_KEYS:
        value = xargs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"vllm_xargs.{key} must be a number of seconds, got {value!r}")
        values[key] = float(value)
    return SLO(**values)
