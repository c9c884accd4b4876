"""The cluster policies on upstreams: Ascendra's pools and offload, QLM's global queue
with each model on its own upstreams, pulling by their capacity."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from tests.fleet.helpers import fleet_server, start_toy, toy_upstreams


async def _burst(url: str, bodies: list[dict[str, Any]]) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:
        answers = await asyncio.gather(*(client.post(f"{url}/v1/completions", json=b)
                                         for b in bodies))
    return [a.status_code for a in answers]


def test_ascendra_offloads_lp_requests_about_to_miss_their_ttft() -> None:
    """A slow LP upstream that runs one request at a time, a fast HP one: requests
    queued on the LP past half their TTFT target move to the HP pool."""
    with toy_upstreams(1, 10.0, "--max-num-seqs", "1") as lp, toy_upstreams(1, 1.0) as hp, \
            fleet_server([lp[0].url, hp[0].url], roles=["lp", "hp"],
                         router="ascendra") as fleet:
        body = {"model": "toy", "prompt": "x", "max_tokens": 20, "ignore_eos": True,
                "slo": {"ttft": 0.3}}
        statuses = asyncio.run(_burst(fleet.url, [body] * 8))
        stats = fleet.fleet.stats()
        received = [u.num_received for u in fleet.fleet.upstreams]
    assert statuses == [200] * 8
    assert stats["offloads"] >= 1
    assert received[1] > 1  # beyond the one idle-HP ticket: the offloads


def test_qlm_keeps_each_model_on_its_upstreams_and_pulls_by_capacity() -> None:
    ups = [start_toy(3.0, "--served-model-name", name) for name in ("alpha", "beta", "alpha")]
    peak = [0, 0, 0]
    stop = threading.Event()
    try:
        with fleet_server([u.url for u in ups], router="qlm", max_num_seqs=2) as fleet:
            def sample() -> None:
                while not stop.is_set():
                    for i, u in enumerate(fleet.fleet.upstreams):
                        peak[i] = max(peak[i], u.num_in_flight)
                    stop.wait(0.002)

            sampler = threading.Thread(target=sample)
            sampler.start()
            bodies = [{"model": m, "prompt": "x", "max_tokens": 30, "ignore_eos": True,
                       "slo": {"deadline": 5.0 if m == "alpha" else 20.0}}
                      for m in ["alpha", "beta"] * 8]
            statuses = asyncio.run(_burst(fleet.url, bodies))
            stop.set()
            sampler.join()
            received = [u.num_received for u in fleet.fleet.upstreams]
    finally:
        stop.set()
        for u in ups:
            u.kill()
    assert statuses == [200] * 16
    assert received[1] == 8 and received[0] + received[2] == 8
    assert max(peak) <= 2, peak  # never more than an upstream's free batch slots
