"""Issue #26, items 3 and 5: slow clients (slowloris) and work on the event loop. Each
test fails with its fix reverted."""

from __future__ import annotations

import threading
import time

import httpx

from andante.server.config import HTTPLimits
from tests.server.batch_helpers import batch_lines, finished, submit, wait_batch
from tests.server.helpers import closed_while_trickling, connect_raw, toy_server

SHORT = HTTPLimits(header_timeout=0.3, body_timeout=0.3, upload_timeout=0.5)



def test_a_request_whose_body_trickles_gets_a_408_and_is_closed() -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n")
    with toy_server(limits=SHORT) as srv:
        sock = connect_raw(srv.host, srv.port, head)
        reply, closed = closed_while_trickling(sock)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert closed  # not held open by the trickle


def test_an_unread_body_closes_the_connection_after_the_answer() -> None:
    """At once, not when the request's timer runs out (10 s here)."""
    with toy_server(limits=HTTPLimits(header_timeout=5, body_timeout=5)) as srv:
        for request in (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n",
                        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"):
            sock = connect_raw(srv.host, srv.port, request)
            reply, closed = closed_while_trickling(sock, seconds=1.0)
            assert reply.split(b"\r\n")[0] in (b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found")
            assert closed


def test_an_upload_obeys_its_own_timeout() -> None:
    head = (b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
            b"boundary=b\r\nContent-Length: 100000\r\n\r\n")
    with toy_server(limits=SHORT) as srv:
        start = time.monotonic()
        sock = connect_raw(srv.host, srv.port, head)
        reply, closed = closed_while_trickling(sock, seconds=3.0)
        assert reply.startswith(b"HTTP/1.1 408") and b"--upload-timeout" in reply, reply
        assert closed and time.monotonic() - start < 2.0


def test_batch_creation_and_finalizing_run_off_the_event_loop() -> None:
    with toy_server() as srv:
        service = srv._app.state.batches  # noqa: SLF001
        threads: list[str] = []
        real_create, real_outcomes = service.create, service.store.outcomes

        def create(*args: object, **kwargs: object) -> object:
            threads.append(threading.current_thread().name)
            return real_create(*args, **kwargs)

        def outcomes(batch_id: str) -> object:
            threads.append(threading.current_thread().name)
            return real_outcomes(batch_id)

        service.create, service.store.outcomes = create, outcomes
        batch = submit(srv.url, batch_lines(3))
        assert wait_batch(srv.url, batch["id"], finished)["status"] == "completed"
    assert len(threads) >= 2
    assert "andante-uvicorn" not in threads  # the event loop's thread


def test_health_answers_while_a_huge_form_is_refused() -> None:
    part = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\ny\r\n'
    body = part * 100_000 + b"--b--\r\n"
    with toy_server() as srv:
        reply = httpx.post(srv.url + "/v1/files", content=body, timeout=30,
                           headers={"Content-Type": "multipart/form-data; boundary=b"})
        assert reply.status_code == 400 and "at most 16 parts" in reply.text
