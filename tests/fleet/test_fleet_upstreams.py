"""The fleet in front of real andante toy servers (separate processes)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from andante.runtime.upstream.metrics import parse_load
from tests.fleet.helpers import Upstream, fleet_server, toy_upstreams


@pytest.fixture(scope="module")
def three() -> Iterator[list[Upstream]]:
    with toy_upstreams(3, 2.0) as ups:
        yield ups


def _events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


def test_stream_passes_through_with_usage(three: list[Upstream]) -> None:
    body = {"model": "toy", "prompt": "hello", "max_tokens": 200, "stream": True,
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    direct = httpx.post(f"{three[0].url}/v1/completions", json=body, timeout=60)
    with fleet_server([u.url for u in three]) as fleet:
        chunks: list[bytes] = []
        arrivals: list[float] = []
        with httpx.stream("POST", f"{fleet.url}/v1/completions", json=body,
                          timeout=60) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            for chunk in r.iter_raw():
                chunks.append(chunk)
                arrivals.append(time.monotonic())
    events = _events(b"".join(chunks))
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 200
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]
                   if json.loads(e)["choices"])
    direct_text = "".join(json.loads(e)["choices"][0]["text"]
                          for e in _events(direct.content)[:-1] if json.loads(e)["choices"])
    assert text == direct_text
    # passed on as they came (200 steps of >= 2 ms), not as one buffered answer
    assert arrivals[-1] - arrivals[0] > 0.25


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "power-of-two"])
def test_routers_spread_over_upstreams(three: list[Upstream], router: str) -> None:
    """Nine requests at once (an idle fleet's ties go to the first upstream)."""
    with fleet_server([u.url for u in three], router=router) as fleet:
        statuses = asyncio.run(_concurrent(fleet.url, 9, {
            "model": "toy", "prompt": "x", "max_tokens": 60, "ignore_eos": True}))
        received = [u.num_received for u in fleet.fleet.upstreams]
    assert statuses == [200] * 9, statuses
    assert sum(received) == 9, received
    assert sum(1 for n in received if n) >= 2, received


async def _concurrent(url: str, count: int, body: dict[str, object]) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:
        answers = await asyncio.gather(*(client.post(f"{url}/v1/completions", json=body)
                                         for _ in range(count)))
    return [a.status_code for a in answers]


def _wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _running(url: str) -> int:
    load = parse_load(httpx.get(f"{url}/metrics", timeout=5).text)
    return (load.num_running or 0) + (load.num_waiting or 0)


def test_client_disconnect_cancels_the_upstream_request(three: list[Upstream]) -> None:
    up = three[1]
    with fleet_server([up.url]) as fleet:
        with httpx.stream("POST", f"{fleet.url}/v1/completions", timeout=30, json={
                "model": "toy", "prompt": "x", "max_tokens": 3000, "ignore_eos": True,
                "stream": True}) as r:
            chunks = r.iter_raw()
            next(chunks)
            _wait_until(lambda: _running(up.url) == 1)
            next(chunks)
        _wait_until(lambda: _running(up.url) == 0)
        assert fleet.fleet.stats()["in_flight"] == 0
