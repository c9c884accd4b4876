"""The fleet app's front: its edge guard holds however the app is served, and the
start-up heap is frozen once the fleet has started."""

from __future__ import annotations

import asyncio
import gc
import time

import httpx
from starlette.testclient import TestClient

from andante.runtime.upstream.discovery import UpstreamSpec, discover
from andante.server.config import HTTPLimits
from andante.server.fleet_app import FleetServeOptions, create_fleet_app
from tests.fleet.helpers import FakeUpstream, fake_upstream, fleet_server

KEY = "sk-fleet-test"


def test_the_returned_app_applies_auth_and_limits_however_it_is_served() -> None:
    """Served by another ASGI server than `andante serve`'s (here Starlette's test
    client), the app still asks for the API key and enforces the body limits, on the
    proxied routes and on FastAPI's."""
    fake = FakeUpstream()
    with fake_upstream(fake) as url:
        infos = asyncio.run(discover((UpstreamSpec(url),), 5.0))
        options = FleetServeOptions((UpstreamSpec(url),), api_key=KEY,
                                    limits=HTTPLimits(max_body_bytes=200), log_level="warning")
        auth = {"authorization": f"Bearer {KEY}"}
        body = {"model": "fake", "prompt": "hi", "max_tokens": 2}
        with TestClient(create_fleet_app(options, infos)) as client:
            assert client.post("/v1/completions", json=body).status_code == 401
            assert client.get("/v1/models").status_code == 401
            assert client.get("/health").status_code == 200
            assert client.get("/v1/models", headers=auth).status_code == 200
            r = client.post("/v1/completions", json=body, headers=auth)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok", r.text
            big = {**body, "prompt": "x" * 400}
            assert client.post("/v1/completions", json=big, headers=auth).status_code == 413
            r = client.post("/v1/completions", content=b"{}",
                            headers={**auth, "content-type": "text/plain"})
            assert r.status_code == 415
    assert len(fake.bodies) == 1


def test_the_start_up_heap_is_frozen_once_the_fleet_runs() -> None:
    """A full collection of the start-up heap stalls the front's event loop (75 ms on
    this machine, once per ~1,000 requests): frozen, collections skip it."""
    gc.unfreeze()
    try:
        with fake_upstream(FakeUpstream()) as url, fleet_server([url]) as fleet:
            assert gc.get_freeze_count() > 1000
            r = httpx.post(f"{fleet.url}/v1/completions", timeout=10,
                           json={"model": "fake", "prompt": "hi"})
            assert r.status_code == 200, r.text
    finally:
        gc.unfreeze()


def test_an_upstreams_empty_stream_is_answered_and_its_request_forgotten() -> None:
    """An upstream answering a stream with a 200 and no byte (content-length 0): the
    client gets the stream's head and its end, the request's task ends, and the
    upstream's in-flight count is back to 0."""
    with fake_upstream(FakeUpstream(empty_streams=True)) as url, \
            fleet_server([url]) as server:
        r = httpx.post(f"{server.url}/v1/completions", timeout=5,
                       json={"model": "fake", "prompt": "hi", "stream": True})
        assert r.status_code == 200 and r.content == b""
        assert r.headers["content-type"].startswith("text/event-stream")
        fleet = server.fleet
        deadline = time.monotonic() + 5  # the forwarding task ends just after the answer
        while fleet.upstreams[0].num_in_flight:
            assert time.monotonic() < deadline, "the forwarding task never ended"
            time.sleep(0.01)
        assert not fleet.calls and fleet.groups["fake"].controller.num_owned == 0
