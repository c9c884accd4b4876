"""A header read timeout for uvicorn's HTTP/1.1 protocol (uvicorn has none: a client may
hold a connection forever by sending its request line a byte at a time).

The timer runs while the connection waits for a request's line and headers: armed when
the connection opens and when part of a request arrives, disarmed once h11 has read the
whole head. A connection idle between requests is uvicorn's keep-alive timeout's job.
On expiry the client gets a JSON 408 and the connection closes. The body has its own
timeout (`openai_api.read_body`).
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from andante.server.errors import error_body


def _timeout_response(seconds: float) -> bytes:
    message = f"the request headers did not arrive within {seconds:g} s (--header-timeout)"
    body = json.dumps(error_body(408, message, None, "request_timeout")).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class HeaderTimeoutH11(H11Protocol):
    header_timeout: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request's head has begun, not ended
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.write(_timeout_response(self.header_timeout))
            self.transport.close()


def h11_protocol(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's `http` protocol class with this header timeout."""
    return type("HeaderTimeoutH11", (HeaderTimeoutH11,), {"header_timeout": header_timeout})
