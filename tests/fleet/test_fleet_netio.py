"""The fleet's asyncio network backend under httpx: a streamed answer's chunks, a
connection the server closed while idle (not reused), a refused connect (httpx's error)."""

from __future__ import annotations

import asyncio
import ssl

import httpx
import pytest

from andante.runtime.upstream.netio import forwarding_transport
from andante.server.listen import bind

CHUNKS = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    for chunk in CHUNKS:
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()  # the connection closes once idle: the next request needs a new one


def _client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=4)
    tls = ssl.create_default_context()
    return httpx.AsyncClient(transport=forwarding_transport(limits, tls), timeout=5.0)


def test_streams_chunks_and_reconnects_after_an_idle_close() -> None:
    async def run() -> list[list[bytes]]:
        server = await asyncio.start_server(_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        got = []
        async with _client() as client:
            for _ in range(2):
                async with client.stream("GET", f"http://127.0.0.1:{port}/") as resp:
                    got.append([data async for data in resp.aiter_raw()])
                await asyncio.sleep(0.05)
        server.close()
        return got

    for chunks in asyncio.run(run()):
        assert b"".join(chunks) == b"".join(CHUNKS)


def test_a_refused_connect_is_httpx_connect_error() -> None:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()

    async def run() -> None:
        async with _client() as client:
            await client.get(f"http://127.0.0.1:{port}/")

    with pytest.raises(httpx.ConnectError):
        asyncio.run(run())
