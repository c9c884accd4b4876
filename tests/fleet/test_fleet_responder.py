"""The fleet front's answer path: `write_now` (one write, no await) and the `Responder`
that sends each event at once from the upstream's callback, else from the request's
task, always in order."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from andante.core.sampling import SLO
from andante.runtime.upstream.call import Call, Chunk, End, Failure
from andante.server.fleet_proxy import SSE_START, Responder
from andante.server.timeouts_httptools import write_now


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after the close"
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _cycle(keep_alive: bool = True) -> tuple[RequestResponseCycle, Transport, list[str]]:
    transport = Transport()
    events: list[str] = []
    cycle = RequestResponseCycle(
        scope={"method": "POST"}, transport=transport,  # type: ignore[arg-type]
        flow=SimpleNamespace(write_paused=False), logger=logging.getLogger("t"),  # type: ignore[arg-type]
        access_logger=logging.getLogger("t"), access_log=False, default_headers=[],
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
        on_response=lambda: events.append(f"complete, closed={transport.closed}"))
    return cycle, transport, events


def test_write_now_sends_a_head_with_its_first_bytes_in_one_write() -> None:
    cycle, transport, _ = _cycle()
    body = {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
    assert write_now(cycle, SSE_START, body)
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
    cycle.flow.write_paused = True  # the client does not read: nothing sent, the caller awaits
    assert not write_now(cycle, {"type": "http.response.body", "body": b"x"})
    assert len(transport.writes) == 1 and not cycle.response_complete


def test_write_now_closes_and_completes_after_its_write() -> None:
    cycle, transport, events = _cycle(keep_alive=False)
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-length", b"2")]}
    assert write_now(cycle, start, {"type": "http.response.body", "body": b"ok"})
    assert transport.writes[0].endswith(b"\r\n\r\nok") and len(transport.writes) == 1
    assert transport.closed and events == ["complete, closed=True"]


def _call() -> Call:
    return Call("cmpl-1", "m", "/v1/completions", {}, SLO(), True, 0.0, 60.0)


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=5), min_size=1, max_size=12),
       refusals=st.lists(st.booleans(), min_size=1, max_size=30),
       pauses=st.lists(st.integers(0, 2), min_size=1, max_size=30),
       failed=st.booleans())
def test_the_client_gets_every_event_once_in_order(chunks: list[bytes], refusals: list[bool],
                                                   pauses: list[int], failed: bool) -> None:
    """Events pushed from callbacks at any moment, `write_now` refusing at random (a
    client that stops reading): the client gets one head, every chunk once and in order,
    then the end, and the task ends."""

    async def main() -> list[Any]:
        got: list[Any] = []
        turn = iter(refusals * 50)

        def now(*messages: Any) -> bool:
            if next(turn, False):
                return False
            got.extend(messages)
            return True

        async def send(message: Any) -> None:
            await asyncio.sleep(0)
            got.append(message)

        call = _call()
        responder = Responder(call, send, now)  # type: ignore[arg-type]
        call.sink = responder.deliver
        task = asyncio.create_task(responder.run())
        for i, data in enumerate(chunks):
            call.push(Chunk(data))
            for _ in range(pauses[i % len(pauses)]):
                await asyncio.sleep(0)
        call.push(Failure(502, "gone", "upstream_failed") if failed else End())
        await asyncio.wait_for(task, 5)
        return got

    got = asyncio.run(main())
    assert got[0] is SSE_START and all(m is not SSE_START for m in got[1:])
    bodies = got[1:]
    assert all(m.get("more_body") for m in bodies[:-1]) and not bodies[-1].get("more_body")
    streamed = b"".join(m["body"] for m in bodies)
    expected = b"".join(chunks)
    if not failed:
        assert streamed == expected
        return
    assert streamed.startswith(expected)
    rest = streamed[len(expected):]  # exactly one error event
    assert rest.startswith(b"data: ") and rest.endswith(b"\n\n") and rest.count(b"\n\n") == 1
    assert json.loads(rest[len(b"data: "):])["error"]["code"] == "upstream_failed"


def test_a_whole_answer_and_a_refusal_before_any_byte() -> None:
    async def main() -> list[Any]:
        got: list[Any] = []
        call = _call()
        responder = Responder(call, None, lambda *m: got.extend(m) or True)  # type: ignore[arg-type]
        call.sink = responder.deliver
        call.push(Failure(503, "no upstream", "upstream_unavailable"))
        await asyncio.wait_for(responder.run(), 5)
        return got

    start, body = asyncio.run(main())
    assert start["status"] == 503 and b"upstream_unavailable" in body["body"]


def test_an_event_after_the_end_is_dropped() -> None:
    """Nothing reaches uvicorn's `send` after the answer's end (it would raise inside
    the upstream connection's callback)."""

    async def main() -> None:
        cycle, transport, _ = _cycle()
        call = _call()
        responder = Responder(call, cycle.send, lambda *m: write_now(cycle, *m))
        call.sink = responder.deliver
        call.push(Chunk(b"data: 1\n\n"))
        call.push(End())
        call.push(Chunk(b"data: late\n\n"))
        call.push(Failure(499, "gone", "aborted"))
        await asyncio.wait_for(responder.run(), 5)
        assert b"late" not in b"".join(transport.writes) and cycle.response_complete

    asyncio.run(main())


def test_an_empty_stream_gets_its_head_and_its_end() -> None:
    """An upstream's stream that ends before any byte (a 200 with an empty body): the
    client gets the stream's head and its end, sent at once, and the task ends."""

    async def main() -> list[Any]:
        got: list[Any] = []
        call = _call()
        responder = Responder(call, None, lambda *m: got.extend(m) or True)  # type: ignore[arg-type]
        call.sink = responder.deliver
        call.push(End())
        await asyncio.wait_for(responder.run(), 5)
        return got

    start, body = asyncio.run(main())
    assert start is SSE_START and body == {"type": "http.response.body", "body": b""}


def test_an_event_that_cannot_be_sent_at_once_goes_to_the_task() -> None:
    """`write_now` raising inside the upstream's callback: the pusher is not hurt, the
    event (and the ones after it) go to the task, which sends them in order, head
    first."""

    async def main() -> list[Any]:
        got: list[Any] = []
        calls: list[int] = []

        def now(*messages: Any) -> bool:
            calls.append(len(messages))
            raise RuntimeError("the transport broke")

        async def send(message: Any) -> None:
            got.append(message)

        call = _call()
        responder = Responder(call, send, now)  # type: ignore[arg-type]
        call.sink = responder.deliver
        call.push(Chunk(b"data: 1\n\n"))
        call.push(Chunk(b"data: 2\n\n"))
        call.push(End())
        await asyncio.wait_for(responder.run(), 5)
        assert calls == [2]  # tried once; the later events waited for the task
        return got

    start, *bodies = asyncio.run(main())
    assert start is SSE_START
    assert b"".join(m["body"] for m in bodies) == b"data: 1\n\ndata: 2\n\n"
    assert not bodies[-1].get("more_body")
