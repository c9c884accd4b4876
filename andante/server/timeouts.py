"""Request timeouts for uvicorn's HTTP/1.1 protocol (uvicorn has none: a client may hold
a connection forever by sending its request a byte at a time).

One timer per request, from its first byte until its body has arrived: the head must
be complete within `header_timeout` seconds, the whole request within `header_timeout +
body_timeout` (`upload_timeout` for `POST /v1/files`). The timer is also armed when a
connection opens (its first request must begin); a connection idle between requests is
uvicorn's keep-alive timeout's job. On expiry the client gets a JSON 408 (unless a
response has begun) and the connection closes.

A response sent while the request's body is still unread (a 413 or 415 from the edge,
a 404, a `GET` with a `Content-Length`) closes the connection after it: otherwise the
client could trickle the rest of the body for as long as it likes, each byte resetting
the keep-alive timer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from andante.server.config import HTTPLimits
from andante.server.errors import error_body

UPLOAD_PATH = "/v1/files"

# a request scope's extension where the protocol offers it: send ASGI messages now, in one
# write, without awaiting (andante.server.timeouts_httptools.write_now; the fleet front)
WRITE_NOW = "andante.write_now"


def timeout_message(limits: HTTPLimits, part: str, body_seconds: float) -> str:
    """What a 408 says: the head (`part` "headers") or the whole request was late."""
    if part == "headers":
        return (f"the request headers did not arrive within {limits.header_timeout:g} s "
                "(--header-timeout)")
    option = "--upload-timeout" if body_seconds != limits.body_timeout else "--body-timeout"
    return (f"the request did not arrive within {limits.header_timeout + body_seconds:g} s "
            f"(--header-timeout + {option})")


def timeout_response(message: str) -> bytes:
    body = json.dumps(error_body(408, message, None, "request_timeout")).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class RequestTimer:
    """The one timer per request that both timed protocols share: armed at a request's
    first byte for its head, re-armed for its body once the head is in, a 408 and the
    connection closed on expiry. A protocol says whether its response has begun."""

    limits: HTTPLimits = HTTPLimits()
    _timer: asyncio.TimerHandle | None = None
    _request_start: float | None = None  # loop time of the current request's first byte
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    scope: Any
    cycle: Any

    def _response_begun(self) -> bool:
        raise NotImplementedError

    def _start_request(self) -> None:
        if self._timer is None:
            self._request_start = self.loop.time()
            self._timer = self.loop.call_later(self.limits.header_timeout, self._expire,
                                               "headers")

    def _time_body(self) -> None:
        """The head is in: the deadline now covers the body."""
        self._disarm()
        start = self._request_start if self._request_start is not None else self.loop.time()
        deadline = start + self.limits.header_timeout + self._body_seconds()
        self._timer = self.loop.call_at(deadline, self._expire, "body")

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
        if not self._response_begun():
            self.transport.write(timeout_response(timeout_message(
                self.limits, part, self._body_seconds())))
        if part == "body" and cycle is not None:  # the app sees a disconnect, sends no more
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


class TimedH11(RequestTimer, H11Protocol):  # type: ignore[misc]
    _timing_body = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self._disarm()  # the body was never read: no keep-alive for a trickle
            self.conn.send(h11.ConnectionClosed())
            self.transport.close()
        super().on_response_complete()

    # ---- the timer ----------------------------------------------------------------
    def _follow_request(self) -> None:
        state = self.conn.their_state
        if state is h11.IDLE:  # a request's head has begun (or a new one after the last)
            self._start_request()
        elif state is h11.SEND_BODY and not self._timing_body:
            self._timing_body = True
            self._time_body()
        elif state is not h11.SEND_BODY:
            self._disarm()
            self._request_start = None
            self._timing_body = False

    def _start_request(self) -> None:
        if self._timer is None:
            self._timing_body = False
        super()._start_request()

    def _response_begun(self) -> bool:
        return self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE)


def h11_protocol(limits: HTTPLimits) -> type[H11Protocol]:
    """uvicorn's `http` protocol class with these timeouts."""
    return type("TimedH11", (TimedH11,), {"limits": limits})

