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
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from andante.server.config import HTTPLimits
from andante.server.timeouts import UPLOAD_PATH, timeout_message, timeout_response


class TimedHttpTools(HttpToolsProtocol):
    limits: HTTPLimits = HTTPLimits()
    _timer: asyncio.TimerHandle | None = None
    _request_start: float | None = None  # loop time of the current request's first byte
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
        self._body_unread = True  # the deadline now covers the body
        self._disarm()
        start = self._request_start if self._request_start is not None else self.loop.time()
        self._timer = self.loop.call_at(start + self.limits.header_timeout
                                        + self._body_seconds(), self._expire, "body")

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

    # ---- the timer ----------------------------------------------------------------
    def _start_request(self) -> None:
        if self._timer is None:
            self._request_start = self.loop.time()
            self._timer = self.loop.call_later(self.limits.header_timeout, self._expire,
                                               "headers")

    def _body_seconds(self) -> float:
        upload = self.scope.get("path") == UPLOAD_PATH if self.scope else False
        return self.limits.upload_timeout if upload else self.limits.body_timeout

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, part: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle  # for "headers": the previous request's, if any
        if cycle is None or not cycle.response_started or cycle.response_complete:
            self.transport.write(timeout_response(timeout_message(
                self.limits, part, self._body_seconds())))
        if part == "body" and cycle is not None:  # the app sees a disconnect, sends no more
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def httptools_protocol(limits: HTTPLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools `http` protocol class with these timeouts."""
    return type("TimedHttpTools", (TimedHttpTools,), {"limits": limits})

