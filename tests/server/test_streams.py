"""Streams under load: disconnects free KV, 50 concurrent streams, the bounded queue."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import openai
import pytest

from andante.server.toy import TOY_TEXT
from tests.server.helpers import toy_server, wait_for


def _raw_stream_request(url: str, max_tokens: int) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    body = f'{{"prompt": "hello", "max_tokens": {max_tokens}, "stream": true}}'.encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def _read_until(sock: socket.socket, marker: bytes, limit: int = 1 << 20) -> bytes:
    data = b""
    while marker not in data:
        piece = sock.recv(4096)
        assert piece and len(data) < limit, data
        data += piece
    return data


def test_disconnect_mid_stream_frees_kv_blocks() -> None:
    with toy_server(toy_step_time=0.01) as srv:
        runner = srv.state.runner
        total = runner.stats.num_blocks
        sock = _raw_stream_request(srv.url, max_tokens=2000)
        _read_until(sock, b"data: ")  # streaming has begun
        wait_for(lambda: runner.stats.num_free_blocks < total)
        sock.close()
        wait_for(lambda: runner.stats.num_free_blocks == total, timeout=5)
        assert runner.stats.num_running == 0
        assert srv.state.hub.num_in_flight == 0
        assert 'finished_reason="abort"' in httpx.get(srv.url + "/metrics").text


def test_disconnect_while_queued_aborts_the_request() -> None:
    with toy_server(toy_step_time=0.01, max_num_seqs=1) as srv:
        runner = srv.state.runner
        first = _raw_stream_request(srv.url, max_tokens=300)
        _read_until(first, b"data: ")
        queued = _raw_stream_request(srv.url, max_tokens=300)
        wait_for(lambda: runner.stats.num_waiting == 1)
        queued.close()
        wait_for(lambda: runner.stats.num_waiting == 0, timeout=5)
        assert srv.state.hub.num_in_flight == 1
        first.close()
        wait_for(lambda: runner.stats.num_free_blocks
                 == runner.stats.num_blocks)


def test_non_streaming_disconnect_aborts() -> None:
    with toy_server(toy_step_time=0.01) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2000},
                       timeout=0.3)
        runner = srv.state.runner
        wait_for(lambda: runner.stats.num_running == 0 and srv.state.hub.num_in_flight == 0)
        assert runner.stats.num_free_blocks == runner.stats.num_blocks


def test_fifty_concurrent_streams_complete() -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        stream = await client.completions.create(model="toy", prompt=f"request {i}",
                                                 max_tokens=30, stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def main(url: str) -> list[str]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(50)))

    with toy_server(max_num_seqs=64) as srv:
        texts = asyncio.run(main(srv.url))
        assert texts == [TOY_TEXT[:30]] * 50
        assert srv.state.hub.num_in_flight == 0


def test_queue_limit_gives_429_with_retry_after() -> None:
    with toy_server(toy_step_time=0.02, max_num_seqs=1, max_queued=2) as srv:
        running = _raw_stream_request(srv.url, max_tokens=500)
        _read_until(running, b"data: ")
        waiting = [_raw_stream_request(srv.url, max_tokens=5) for _ in range(2)]
        wait_for(lambda: srv.state.hub.num_not_started == 2)
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "late", "max_tokens": 5})
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        running.close()  # frees the slot: the queued ones run, the queue drains
        wait_for(lambda: srv.state.hub.num_not_started == 0)
        start = time.monotonic()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "now", "max_tokens": 5})
        assert r.status_code == 200, r.text
        assert time.monotonic() - start < 5
        for sock in waiting:
            sock.close()
