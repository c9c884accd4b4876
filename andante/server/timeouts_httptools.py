"""The request timeouts of `andante.server.timeouts`, on uvicorn's httptools protocol.

The fleet front parses every proxied request's head and writes every answer's head and
chunks on its one event loop; with uvicorn's h11 protocol (pure Python) that is the
larger part of its CPU per request, with httptools (llhttp, in C) about a quarter less
in all (benchmarks/fleet.py). The rules are the same as `TimedH11`'s: one timer per
request, armed at the connection's start and at a request's first byte, the head within
`header_timeout`, the whole request within `header_timeout + body_timeout`
(`upload_timeout` for `POST /v1/files`), a JSON 408 on expiry (unless a response has
begun) and the connection closed; an answer sent while the body is still unread closes
the connection after it. Here the parser's callbacks mark the steps (a request begins,
its head is in, its body is in) where `TimedH11` reads h11's states.

Each request's scope also offers `WRITE_NOW` (`write_now`): ASGI messages sent at once,
from any callback, in one write, without awaiting, where the client reads (the fleet
front relays an upstream's bytes from the upstream connection's callback: no task switch
per chunk, and a response's head goes out with its first bytes in one packet).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from andante.server.config import HTTPLimits
from andante.server.timeouts import WRITE_NOW, RequestTimer


class _Gathered:
    """The transport's stand-in while `write_now` sends: writes are gathered into one,
    a close waits for it."""

    __slots__ = ("closing", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return False


def write_now(cycle: RequestResponseCycle, *messages: Any) -> bool:
    """Send `messages` through uvicorn's `send` without awaiting it, their bytes in one
    write; False, none sent, where `send` would wait (the client does not read: flow
    control): the caller then awaits `send` for each."""
    if cycle.flow.write_paused and not cycle.disconnected:
        return False
    transport, gathered = cycle.transport, _Gathered()
    on_response, completed = cycle.on_response, []
    cycle.transport = gathered  # type: ignore[assignment]
    cycle.on_response = lambda: completed.append(True)  # after the write, not before
    try:
        for message in messages:
            step = cycle.send(message)
            try:
                step.send(None)
            except StopIteration:
                continue
            step.close()
            raise RuntimeError("uvicorn's send waited in write_now")
    finally:
        cycle.transport, cycle.on_response = transport, on_response
        if gathered.parts:
            transport.write(b"".join(gathered.parts))
        if gathered.closing:
            transport.close()
        if completed:
            on_response()
    return True


class TimedHttpTools(RequestTimer, HttpToolsProtocol):  # type: ignore[misc]
    _body_unread = False  # a request's head is in, its body not all

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_request()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._body_unread = True
        self._time_body()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            self.scope.setdefault("extensions", {})[WRITE_NOW] = partial(write_now, cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._body_unread = False
        self._disarm()
        self._request_start = None

    def on_response_complete(self) -> None:
        if self._body_unread and not self.transport.is_closing():
            self._disarm()  # the body was never read: no keep-alive for a trickle
            self.transport.close()
        super().on_response_complete()

    def _response_begun(self) -> bool:
        cycle = self.cycle  # the current request's, or the previous one's
        return cycle is not None and cycle.response_started and not cycle.response_complete


def httptools_protocol(limits: HTTPLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools `http` protocol class with these timeouts."""
    return type("TimedHttpTools", (TimedHttpTools,), {"limits": limits})

