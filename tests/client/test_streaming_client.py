"""The async client against a live server: records, paced delivery, errors, SSE parsing."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from andante.client import ClientError, StreamingClient
from andante.client.sse import iter_events
from andante.core import SLO
from andante.metrics import ttft
from andante.server import ServerThread
from andante.server.toy import TOY_TEXT


def test_stream_records_every_token(server: ServerThread) -> None:
    async def main() -> None:
        async with StreamingClient(server.url) as client:
            result = await client.stream("hello", max_tokens=20, slo=SLO(ttft=2.0, tds=5.0))
        assert result.text == TOY_TEXT[:20]
        record = result.record
        assert record.num_output_tokens == 20 and record.finish_reason == "length"
        assert record.num_prompt_tokens == 5
        assert list(record.token_times) == sorted(record.token_times)
        first = ttft(record)
        assert first is not None and 0 < first < 2
        assert result.qoe == 1.0

    asyncio.run(main())


def test_chat_stream(server: ServerThread) -> None:
    async def main() -> None:
        async with StreamingClient(server.url + "/v1") as client:
            result = await client.stream(messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=6)
        assert result.text == TOY_TEXT[:6] and result.record.num_output_tokens == 6

    asyncio.run(main())


def test_paced_stream_releases_at_the_reading_speed(server: ServerThread) -> None:
    async def main() -> None:
        async with StreamingClient(server.url) as client:
            paced = client.paced(25.0, prompt="hi", max_tokens=10, slo=SLO(ttft=1.0, tds=25.0))
            pieces = [piece async for piece in paced]
        assert "".join(pieces) == TOY_TEXT[:10]
        released = [t.release for t in paced.pacer.released]
        gaps = [b - a for a, b in zip(released, released[1:], strict=False)]
        assert min(gaps) >= 0.04 * 0.95  # never faster than 25 tokens/s
        assert paced.result is not None and paced.result.record.num_output_tokens == 10
        assert paced.experienced_qoe is not None and paced.experienced_qoe > 0.9

    asyncio.run(main())


def test_http_errors_raise_client_error(server: ServerThread) -> None:
    async def main() -> None:
        async with StreamingClient(server.url, model="nope") as client:
            with pytest.raises(ClientError) as err:
                await client.stream("x", max_tokens=2)
        assert err.value.status == 404 and "nope" in err.value.message

    asyncio.run(main())


def test_sse_parser_handles_split_events() -> None:
    body = (b'data: {"a": 1}\n\n: comment\n\ndata: {"b":\ndata: 2}\n\n'
            b'data: [DONE]\n\ndata: {"late": 1}\n\n')

    async def main() -> list[dict[str, int]]:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
        async with httpx.AsyncClient(transport=transport) as http:
            response = await http.get("http://test/")
            return [e async for e in iter_events(response)]

    assert asyncio.run(main()) == [{"a": 1}, {"b": 2}]
