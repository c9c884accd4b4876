"""The fleet's proxied routes (`POST /v1/completions`, `/v1/chat/completions`) as a plain
ASGI handler, under the edge guard and in front of the FastAPI routes.

Design note (issue 29, the proxy's added latency). A proxied request is parsed just
enough to be routed (its model, SLO, priority and length), placed by the fleet, and its
upstream's answer relayed: SSE bytes as they arrive, else the whole answer. Each event
is sent in the upstream connection's own callback (`Responder`, through the protocol's
`write_now`: the response head goes with the first bytes in one write, and no task
switch stands between an upstream's byte and the client). When 100 first tokens arrive
in one upstream step, the k-th client's now waits for k reads and k writes, not for all
100 reads and then k task switches and 2k writes. A client that does not read (flow
control) has its events queued for the request's task, which sends them in order (the
chunks queued behind one in one write) until the queue is empty. Going
around FastAPI's routing, request objects and `StreamingResponse` (a task group per
response) saves a good part of the per-request CPU on the one event loop that every
request shares. The client's disconnect is watched by one task per request: it aborts
the request wherever it is (queued, or streaming from an upstream, whose connection
then closes). Bad input gets the same OpenAI-style errors as everywhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from andante.core.sampling import SLO
from andante.runtime.upstream.call import (
    Call,
    Chunk,
    Delivered,
    End,
    Event,
    Failure,
    Full,
    slo_from,
)
from andante.runtime.upstream.fleet import CLIENT_CLOSED, Fleet, FleetOptions
from andante.server.config import HTTPLimits
from andante.server.errors import APIError, error_body, from_pydantic
from andante.server.guard import too_large
from andante.server.protocol import SLOBody
from andante.server.timeouts import WRITE_NOW

CHARS_PER_TOKEN = 4  # the prompt's length for routing, without the upstream's tokenizer
PROXIED = frozenset({"/v1/completions", "/v1/chat/completions"})
SSE_HEAD = [(b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
SSE_START: Message = {"type": "http.response.start", "status": 200, "headers": SSE_HEAD}
log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client went away while sending its request."""


class FleetProxy:
    """ASGI middleware: serves the proxied routes itself, passes on everything else."""

    def __init__(self, app: ASGIApp, fleet: Fleet, limits: HTTPLimits,
                 fleet_options: FleetOptions) -> None:
        self.app = app
        self.fleet = fleet
        self.limits = limits
        self.options = fleet_options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in PROXIED:
            await self.app(scope, receive, send)
            return
        try:
            call, prompt_tokens, max_tokens, priority = await self._accept(scope, receive)
        except APIError as exc:
            await send_json(send, exc.status, error_body(exc.status, exc.message, exc.param,
                                                        exc.code), exc.headers)
            return
        except ClientGone:
            return
        fleet = self.fleet
        responder = Responder(call, send, (scope.get("extensions") or {}).get(WRITE_NOW))
        call.sink = responder.deliver
        fleet.submit(call, prompt_tokens, max_tokens, priority)
        watcher = asyncio.create_task(_watch_disconnect(receive,
                                                        lambda: fleet.abort(call.request_id)))
        try:
            await responder.run()
        finally:
            watcher.cancel()
            if not call.finished:
                fleet.abort(call.request_id)

    async def _accept(self, scope: Scope, receive: Receive
                      ) -> tuple[Call, int, int | None, int]:
        if not self.fleet.alive:
            raise APIError(503, "every upstream is down", None, "upstream_unavailable")
        raw = await receive_body(receive, self.limits)
        body = json_body(raw)
        call, prompt_tokens, max_tokens = new_call(self.fleet, self.options, body,
                                                   scope["path"], raw)
        return call, prompt_tokens, max_tokens, int(body.get("priority", 0))


DELIVERED = Delivered()


class Responder:
    """Sends one proxied request's answer, event by event (`Call.push`): at once, in the
    pusher's callback (the upstream connection's), through the server's `write_now`
    where it offers one and the client reads; else, in order, by the request's task
    (`run`) with `send`. Once an event waits for the task, the later ones do too."""

    __slots__ = ("busy", "call", "done", "head_sent", "send", "write_now")

    def __init__(self, call: Call, send: Send,
                 write_now: Callable[..., bool] | None) -> None:
        self.call = call
        self.send = send
        self.write_now = write_now
        self.head_sent = False
        self.done = False  # the answer's end was sent: later events are dropped
        self.busy = write_now is None  # events wait for the task

    def deliver(self, event: Event) -> bool:
        """`Call.sink`: send `event` now (True), or leave it to the task (False: where
        the client does not read, or sending here failed: the task sends it, or fails
        where the client sees it, never inside the upstream's callback)."""
        if self.done:
            return True
        if self.busy:
            return False
        head_sent = self.head_sent
        try:
            messages, final = self.messages(event)
            assert self.write_now is not None
            sent = self.write_now(*messages)
        except Exception:
            log.exception("request %s: an event could not be sent at once; its task sends "
                          "it", self.call.request_id)
            sent = False
        if not sent:  # nothing sent: the task sends it all
            self.busy, self.head_sent = True, head_sent
            return False
        if final:
            self.done = True
            self.call.events.put_nowait(DELIVERED)
        return True

    async def run(self) -> None:
        """The events left to the task, in order (a lagging client gets the chunks
        queued behind one in one write, and the bytes that came with the end with it),
        until the answer's end."""
        events = self.call.events
        while True:
            event = await events.get()
            if isinstance(event, Delivered):
                return
            prefix = b""
            if isinstance(event, Chunk):
                data, end = coalesce(self.call, event.data)
                event, prefix = (Chunk(data), b"") if end is None else (end, data)
            messages, final = self.messages(event, prefix)
            self.done = final
            for message in messages:
                await self.send(message)
            if final:
                return
            if events.empty():
                self.busy = self.write_now is None

    def messages(self, event: Event, prefix: bytes = b"") -> tuple[list[Message], bool]:
        """The ASGI messages for `event` (after the stream bytes `prefix`), and whether
        they end the answer. Marks the head as sent: call once per event."""
        if self.head_sent or prefix or isinstance(event, (Chunk, End)):
            return self._stream_messages(event, prefix)
        self.head_sent = True
        return whole_answer(event), True

    def _stream_messages(self, event: Event, prefix: bytes) -> tuple[list[Message], bool]:
        """A stream's part: its head first if not sent yet (an upstream's empty stream
        gets its head and its end), then a chunk, or the end (with an error event if
        the stream failed)."""
        out: list[Message] = [] if self.head_sent else [SSE_START]
        self.head_sent = True
        if isinstance(event, Chunk):
            out.append({"type": "http.response.body", "body": prefix + event.data,
                        "more_body": True})
            return out, False
        data = prefix
        if isinstance(event, Failure) and event.status != CLIENT_CLOSED:
            error = error_body(event.status, event.message, None, event.code)
            data += b"data: " + json.dumps(error).encode() + b"\n\n"
        out.append({"type": "http.response.body", "body": data})
        return out, True


def whole_answer(event: Event) -> list[Message]:
    """A whole answer's messages, before any byte was sent: the upstream's `Full`
    answer, or a `Failure` as a JSON error (an empty 499 for a client gone)."""
    if isinstance(event, Failure):
        if event.status == CLIENT_CLOSED:
            return _whole(CLIENT_CLOSED, [], b"")
        return json_messages(event.status, error_body(event.status, event.message, None,
                                                      event.code))
    assert isinstance(event, Full), event  # chunks and ends are a stream's
    return _whole(event.status, [(b"content-type", event.content_type.encode("latin-1"))],
                  event.content)


def _whole(status: int, headers: list[tuple[bytes, bytes]], content: bytes) -> list[Message]:
    """A whole answer's two messages."""
    head = [*headers, (b"content-length", str(len(content)).encode())]
    return [{"type": "http.response.start", "status": status, "headers": head},
            {"type": "http.response.body", "body": content}]


def coalesce(call: Call, data: bytes) -> tuple[bytes, Event | None]:
    """`data` and the chunks already queued behind it as one write, and the end event
    met on the way, if any (never `Delivered`: it is queued only on an empty queue)."""
    events = call.events
    if events.empty():
        return data, None
    parts = [data]
    while not events.empty():
        event = events.get_nowait()
        assert not isinstance(event, Delivered), "an event queued after the answer's end"
        if not isinstance(event, Chunk):
            return b"".join(parts), event
        parts.append(event.data)
    return b"".join(parts), None


def json_messages(status: int, body: dict[str, Any],
                  headers: dict[str, str] | None = None) -> list[Message]:
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1"))
             for k, v in (headers or {}).items()]
    return _whole(status, [(b"content-type", b"application/json"), *extra],
                  json.dumps(body).encode())


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: dict[str, str] | None = None) -> None:
    for message in json_messages(status, body, headers):
        await send(message)


async def receive_body(receive: Receive, limits: HTTPLimits) -> bytes:
    """The request's body: at most `limits.max_body_bytes` (413), within
    `limits.body_timeout` seconds (408); ClientGone if the client left meanwhile. A body
    that came with its head (most) is returned without arming a timer: the protocol's
    own (andante.server.timeouts) bounds the wait for the first part."""
    message: Message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        chunk: bytes = message.get("body", b"")
        if len(chunk) > limits.max_body_bytes:
            raise too_large(len(chunk), limits.max_body_bytes)
        return chunk
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout):
            while True:
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise too_large(size, limits.max_body_bytes)
                parts.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(parts)
                message = await receive()
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within "
                       f"{limits.body_timeout:g} s (--body-timeout)", None,
                       "request_timeout") from None


async def _watch_disconnect(receive: Receive, on_disconnect: Callable[[], None]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


# ---- the request, as far as routing needs it ---------------------------------------------
def json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise APIError(400, f"invalid JSON body: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", None, "invalid_value")
    return body


def _model(fleet: Fleet, body: dict[str, Any]) -> str:
    model = body.get("model")
    served = fleet.models
    if model is None and len(served) == 1:
        return served[0]
    if model not in fleet.groups:
        raise APIError(404, f"model {model!r} is not served here; served models: "
                       f"{', '.join(served)}", "model", "model_not_found")
    return str(model)


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise APIError(400, f"max_tokens must be a positive integer, got {value!r}",
                       "max_tokens", "invalid_value")
    return value


def _prompt_tokens(body: dict[str, Any], raw: bytes) -> int:
    """The prompt's length in tokens, estimated (routing only): token ids counted, text
    from the body's length (the prompt is most of it; no second serialization)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return len(raw) // CHARS_PER_TOKEN


def _slo(body: dict[str, Any]) -> SLO:
    raw = body.pop("slo", None)
    try:
        given = None if raw is None else SLOBody.model_validate(raw)
        return slo_from(body, None if given is None else SLO(**given.model_dump()))
    except ValidationError as exc:
        error = from_pydantic(exc)
        raise APIError(400, f"slo: {error.message}", "slo", "invalid_value") from None
    except ValueError as exc:
        raise APIError(400, str(exc), "vllm_xargs", "invalid_value") from None


def new_call(fleet: Fleet, options: FleetOptions, body: dict[str, Any], path: str,
             raw: bytes) -> tuple[Call, int, int | None]:
    """The fleet's `Call` for a client's body (`raw`, parsed: APIError on bad input), the
    prompt's estimated length and its max_tokens. The body goes to the upstream as the
    client sent it (`raw`) unless there is something to rewrite: an SLO (`slo`,
    `vllm_xargs`) or the model left out."""
    as_sent = body.get("model") is not None and "slo" not in body and "vllm_xargs" not in body
    model = _model(fleet, body)
    slo = _slo(body)
    max_tokens = _max_tokens(body)
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise APIError(400, f"priority must be an integer, got {priority!r}", "priority",
                       "invalid_value")
    body["model"] = model
    arrival = fleet.clock.now()
    prefix = "chatcmpl" if path.endswith("chat/completions") else "cmpl"
    window = slo.deadline if slo.deadline is not None else options.retry_window_s
    call = Call(f"{prefix}-{uuid.uuid4().hex}", model, path, body, slo, body.get("stream") is True,
                arrival, arrival + window, raw=raw if as_sent else None)
    return call, _prompt_tokens(body, raw), max_tokens
