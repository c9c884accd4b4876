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
from andante.server.timeouts import RequestTimer


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

