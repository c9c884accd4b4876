"""The fleet front's request timeouts and connection rules on the protocol it serves with
(httptools where installed: andante.server.timeouts_httptools; else h11): slow heads and
bodies get a 408 and a closed connection, an answer sent over an unread body closes the
connection, and kept-alive connections serve request after request."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from andante.runtime.upstream.discovery import UpstreamSpec
from andante.runtime.upstream.fleet import FleetOptions
from andante.server.config import HTTPLimits
from andante.server.fast_protocol import fast_protocol
from andante.server.fleet_app import FleetServeOptions
from andante.server.fleet_launch import FleetServerThread
from tests.fleet.helpers import FakeUpstream, fake_upstream
from tests.server.helpers import closed_while_trickling, connect_raw

SHORT = HTTPLimits(header_timeout=0.3, body_timeout=0.3, upload_timeout=0.6)
POST_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100000\r\n\r\n")


@contextmanager
def _fleet(limits: HTTPLimits) -> Iterator[FleetServerThread]:
    with fake_upstream(FakeUpstream()) as url:
        options = FleetServeOptions((UpstreamSpec(url),), FleetOptions(poll_interval=0.2),
                                    port=0, log_level="warning", limits=limits)
        with FleetServerThread(options) as server:
            yield server


def _connect(server: FleetServerThread, data: bytes) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return connect_raw(host, int(port), data)


def test_the_fleet_serves_with_httptools_where_installed() -> None:
    pytest.importorskip("httptools")
    assert fast_protocol(SHORT).__name__ == "TimedHttpTools"


def test_a_trickled_body_or_head_gets_a_408_and_is_closed() -> None:
    with _fleet(SHORT) as server:
        reply, closed = closed_while_trickling(_connect(server, POST_HEAD))
        assert reply.startswith(b"HTTP/1.1 408") and b"--body-timeout" in reply, reply
        assert closed
        reply, closed = closed_while_trickling(_connect(server, b"GET /health HTTP/1.1\r\n"))
        assert reply.startswith(b"HTTP/1.1 408") and b"--header-timeout" in reply, reply
        assert closed
        upload = (b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                  b"boundary=b\r\nContent-Length: 100000\r\n\r\n")
        started = time.monotonic()
        reply, closed = closed_while_trickling(_connect(server, upload), seconds=3.0)
        assert reply.startswith(b"HTTP/1.1 408") and b"--upload-timeout" in reply, reply
        assert closed and time.monotonic() - started < 2.5
        assert httpx.get(server.url + "/health").status_code == 200


def test_an_unread_body_closes_the_connection_after_the_answer() -> None:
    """At once, not when the request's timer runs out (5 s here)."""
    with _fleet(HTTPLimits(header_timeout=5, body_timeout=5)) as server:
        for request in (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n",
                        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"):
            reply, closed = closed_while_trickling(_connect(server, request), seconds=1.0)
            assert reply.split(b"\r\n")[0] in (b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found")
            assert closed


def test_a_kept_alive_connection_serves_request_after_request() -> None:
    """The timer of one request never fires on the next (or between them)."""
    with _fleet(SHORT) as server, httpx.Client(base_url=server.url, timeout=5) as client:
        for _ in range(3):
            r = client.post("/v1/completions", json={"model": "fake", "prompt": "x"})
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
            time.sleep(SHORT.header_timeout + SHORT.body_timeout + 0.1)  # idle, kept
        assert client.get("/health").status_code == 200
