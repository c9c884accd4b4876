"""The fleet's pass-through HTTP/1.1 client (andante.runtime.upstream.http1): framing,
keep-alive, cancellation, against a raw asyncio server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from andante.runtime.upstream.http1 import (
    ConnectFailed,
    Dechunker,
    UpstreamError,
    UpstreamPool,
    parse_head,
)


def chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    out = [b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces if p]
    return b"".join(out) + b"0\r\n" + trailers + b"\r\n"


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)  # a loaded machine
@given(st.lists(st.binary(min_size=0, max_size=300), max_size=8),
       st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=40),
       st.booleans())
def test_dechunker_any_split(pieces: list[bytes], cuts: list[int], trailers: bool) -> None:
    wire = chunked(pieces, b"x-t: 1\r\n" if trailers else b"") + b"NEXT"
    dechunker, out, pos = Dechunker(), [], 0
    for size in cuts * (len(wire) // sum(cuts) + 1):
        if pos >= len(wire) or dechunker.done:
            break
        out.append(dechunker.feed(wire[pos:pos + size]))
        pos += size
    assert dechunker.done
    assert b"".join(out) == b"".join(pieces)


def test_dechunker_refuses_a_bad_size() -> None:
    with pytest.raises(UpstreamError, match="chunk size"):
        Dechunker().feed(b"zz\r\nabc")


def test_parse_head() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      b"Transfer-Encoding: chunked")
    assert (head.status, head.content_type, head.chunked, head.keep_alive) == (
        200, "text/event-stream", True, True)
    head = parse_head(b"HTTP/1.1 429 Too Many\r\ncontent-length: 12\r\nconnection: close")
    assert (head.status, head.content_length, head.keep_alive) == (429, 12, False)
    assert not parse_head(b"HTTP/1.0 200 OK\r\ncontent-length: 1").keep_alive
    with pytest.raises(UpstreamError):
        parse_head(b"garbage")


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_keep_alive_streaming_and_content_length() -> None:
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while True:
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
            if b'"stream":true' in request:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                for i in range(3):
                    writer.write(chunked([b"data: %d\n\n" % i])[:-5])  # no terminator
                    await writer.drain()
                    await asyncio.sleep(0.01)
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 503 Busy\r\ncontent-length: 4\r\n\r\nbusy")

    async def main() -> None:
        async with raw_server(handler) as url:
            pool = UpstreamPool(url, connect_timeout=2)
            conn = await pool.post("/v1/completions", b'{"stream":true}')
            got: list[bytes] = []
            await conn.stream(got.append)
            assert b"".join(got) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            assert len(got) >= 2  # pieces as they arrived, not one at the end
            conn = await pool.post("/v1/completions", b"{}")
            assert conn.head is not None and conn.head.status == 503
            assert await conn.read() == b"busy"
            assert pool.num_opened == 1 and len(connections) == 1
            pool.close()

    run(main())


def test_cancel_closes_the_connection() -> None:
    closed = asyncio.Event

    async def main() -> None:
        seen_eof = closed()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n")
            await writer.drain()
            if await reader.read() == b"":  # the client closed its side
                seen_eof.set()

        async with raw_server(handler) as url:
            pool = UpstreamPool(url, connect_timeout=2)
            conn = await pool.post("/v1/completions", b"{}")
            got: list[bytes] = []
            task = asyncio.create_task(conn.stream(got.append))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(seen_eof.wait(), 5)
            assert got == [b"hello"] and conn.closed and not pool._idle

    run(main())


def test_idle_connection_closed_by_the_upstream_is_replaced() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive said, then closed: the next request races it

    async def main() -> None:
        async with raw_server(handler) as url:
            pool = UpstreamPool(url, connect_timeout=2)
            for _ in range(3):
                conn = await pool.post("/v1/completions", b"{}")
                assert await conn.read() == b"ok"
            assert pool.num_opened == 3

    run(main())


def test_lost_mid_body_and_refused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()

    async def main() -> None:
        async with raw_server(handler) as url:
            pool = UpstreamPool(url, connect_timeout=2)
            conn = await pool.post("/v1/completions", b"{}")
            with pytest.raises(UpstreamError, match="connection lost"):
                await conn.read()
            port = int(url.rsplit(":", 1)[1])
        with pytest.raises(ConnectFailed):
            await UpstreamPool(f"http://127.0.0.1:{port}", 2).post("/x", b"{}")

    run(main())


def test_early_on_data_gets_a_200_body_before_the_caller_resumes() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            if b"busy" in request:  # not a 200: its body is the caller's to read
                writer.write(b"HTTP/1.1 503 Busy\r\ncontent-length: 4\r\n\r\nbusy")
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         + chunked([b"data: first\n\n"])[:-5])  # with the head
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(chunked([b"data: last\n\n"]))

    async def main() -> None:
        async with raw_server(handler) as url:
            pool = UpstreamPool(url, connect_timeout=2)
            early: list[bytes] = []
            conn = await pool.post("/v1/completions", b"{}", early.append)
            await asyncio.sleep(0.01)  # the caller is slow to resume: the bytes went anyway
            assert early == [b"data: first\n\n"]
            await conn.stream(early.append)
            assert b"".join(early) == b"data: first\n\ndata: last\n\n"
            refused: list[bytes] = []
            conn = await pool.post("/v1/completions", b'{"busy":1}', refused.append)
            assert conn.head is not None and conn.head.status == 503
            assert await conn.read() == b"busy" and not refused
            assert pool.num_opened == 1
            pool.close()

    run(main())
