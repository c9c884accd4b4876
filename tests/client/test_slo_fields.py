"""The client puts a request's SLO where the server reads it: andante's `slo` object, or
`vllm_xargs` flat keys on a vLLM server (andante's scheduler class reads them there)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from andante.client import StreamingClient
from andante.core.sampling import SLO

SSE = (b'data: {"id": "x", "choices": [{"text": "hi", "finish_reason": "stop"}]}\n\n'
       b"data: [DONE]\n\n")


def _serve(owner: str | None, bodies: list[dict]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            model = {"id": "m", "object": "model"} | ({"owned_by": owner} if owner else {})
            return httpx.Response(200, json={"data": [model]})
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=SSE,
                              headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _send(owner: str | None, slo: SLO | None, extra: dict | None = None) -> dict:
    bodies: list[dict] = []

    async def go() -> None:
        async with StreamingClient("http://test", model="m", http=_serve(owner, bodies)) as c:
            result = await c.stream("hello", max_tokens=4, slo=slo, extra=extra)
            assert result.text == "hi"

    asyncio.run(go())
    return bodies[0]


SLO_ALL = SLO(ttft=0.5, tbt=0.1, tds=8.0, deadline=20.0)
FIELDS = {"ttft": 0.5, "tbt": 0.1, "tds": 8.0, "deadline": 20.0}


@pytest.mark.parametrize("owner", ["andante", None, "sglang"])
def test_andante_and_other_servers_get_the_slo_object(owner: str | None) -> None:
    body = _send(owner, SLO_ALL)
    assert body["slo"] == FIELDS and "vllm_xargs" not in body


def test_a_vllm_server_gets_flat_vllm_xargs() -> None:
    body = _send("vllm", SLO(ttft=0.5, tds=8.0))
    assert body["vllm_xargs"] == {"ttft": 0.5, "tds": 8.0} and "slo" not in body


def test_vllm_xargs_the_caller_set_are_kept() -> None:
    body = _send("vllm", SLO_ALL, extra={"vllm_xargs": {"mine": 1}})
    assert body["vllm_xargs"] == {"mine": 1, **FIELDS}


def test_no_slo_sends_neither() -> None:
    body = _send("vllm", None)
    assert "slo" not in body and "vllm_xargs" not in body
