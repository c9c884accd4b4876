"""Faults with real upstream processes: kill -9 under load, an upstream that stops
answering (SIGSTOP) and comes back (SIGCONT)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from typing import Any

import httpx

from tests.fleet.helpers import Upstream, fleet_server, toy_upstreams

MAX_TOKENS = 60


async def _one(client: httpx.AsyncClient, url: str, stream: bool, delay: float
               ) -> dict[str, Any]:
    await asyncio.sleep(delay)
    body = {"model": "toy", "prompt": "x", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": stream}
    if not stream:
        r = await client.post(f"{url}/v1/completions", json=body)
        tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
        return {"stream": False, "status": r.status_code, "tokens": tokens}
    raw = b""
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for chunk in r.aiter_raw():
            raw += chunk
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    error = any('"error"' in e for e in events)
    done = bool(events) and events[-1] == "[DONE]"
    finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events
              if e.startswith("{") and "choices" in e]
    return {"stream": True, "status": r.status_code, "error": error, "done": done,
            "finished": "length" in finish}


async def _load(url: str, count: int, spread_s: float, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(_one(client, url, i % 2 == 1, rng.uniform(0, spread_s))
                                      for i in range(count)))


def test_kill_9_one_of_three_under_load_loses_nothing_accepted() -> None:
    with toy_upstreams(3, 3.0) as ups, \
            fleet_server([u.url for u in ups], router="least-loaded") as fleet:
        victim: Upstream = ups[1]

        async def scenario() -> list[dict[str, Any]]:
            load = asyncio.create_task(_load(fleet.url, 60, 1.5))
            started = time.monotonic()  # kill it while it holds work, however slow the load
            while not fleet.fleet.upstreams[1].num_in_flight:
                assert time.monotonic() - started < 10.0, "no request reached the victim"
                await asyncio.sleep(0.005)
            victim.kill()
            return await load

        results = asyncio.run(scenario())
        stats = fleet.fleet.stats()
    assert not stats["upstreams"][1]["alive"]
    assert stats["upstreams"][1]["in_flight"] == 0
    plain = [r for r in results if not r["stream"]]
    streams = [r for r in results if r["stream"]]
    # nothing without a streamed byte is lost: every non-streamed request completes
    assert all(r["status"] == 200 and r["tokens"] == MAX_TOKENS for r in plain), plain
    # a stream either completes or ends with an explicit error event, never silently
    for r in streams:
        assert r["status"] == 200
        assert (r["done"] and r["finished"] and not r["error"]) or r["error"], r
    assert stats["failed"] == sum(r.get("error", False) for r in streams)
    # the victim had work: re-queued, retried elsewhere, or (a started stream) failed
    assert stats["requeued"] + stats["retries"] + stats["failed"] >= 1


def test_an_upstream_that_stops_answering_is_down_then_back() -> None:
    with toy_upstreams(2, 2.0) as ups, \
            fleet_server([u.url for u in ups], probe_timeout=1.0, down_after=2) as fleet:
        frozen = ups[0]

        async def scenario() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(timeout=30) as client:
                load = [asyncio.create_task(_one(client, fleet.url, False, 0.0))
                        for _ in range(6)]
                started = time.monotonic()
                while not fleet.fleet.upstreams[0].num_in_flight:
                    assert time.monotonic() - started < 5.0, "no request reached it"
                    await asyncio.sleep(0.005)
                os.kill(frozen.proc.pid, signal.SIGSTOP)
                started = time.monotonic()
                while fleet.fleet.upstreams[0].alive:
                    assert time.monotonic() - started < 6.0, "not marked down in time"
                    await asyncio.sleep(0.02)
                return await asyncio.gather(*load)

        try:
            results = asyncio.run(scenario())
            # its requests without a token moved to the other upstream
            assert all(r["status"] == 200 and r["tokens"] == MAX_TOKENS for r in results)
            assert fleet.fleet.stats()["requeued"] >= 1
            # served by the other meanwhile
            r = httpx.post(f"{fleet.url}/v1/completions", timeout=10,
                           json={"model": "toy", "prompt": "x", "max_tokens": 3})
            assert r.status_code == 200
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        started = time.monotonic()
        while not fleet.fleet.upstreams[0].alive:
            assert time.monotonic() - started < 5.0, "not back in time"
            time.sleep(0.02)
        metrics = httpx.get(f"{fleet.url}/metrics").text
        assert f'andante:upstream_up{{upstream="{frozen.url}"}} 1' in metrics
