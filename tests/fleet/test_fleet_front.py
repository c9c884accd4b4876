"""The fleet app's front: its edge guard holds however the app is served, the serve
path freezes the start-up heap, an upstream's empty stream is answered."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from andante.runtime.upstream.discovery import UpstreamSpec, discover
from andante.server import fleet_launch
from andante.server.config import HTTPLimits
from andante.server.fleet_app import FleetServeOptions, create_fleet_app
from tests.fleet.helpers import FakeUpstream, fake_upstream, fleet_options, fleet_server

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


def test_the_serve_path_freezes_the_start_up_heap_and_an_in_process_app_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full collection of the start-up heap stalls the front's event loop (75 ms on
    this machine, once per ~1,000 requests): `andante fleet` freezes it before serving,
    but an app served in-process (a test's, a benchmark's server thread) leaves its
    host's heap to the collector."""
    frozen_when_served: list[int] = []

    class Served:
        def run(self, sockets: list[Any]) -> None:
            frozen_when_served.append(gc.get_freeze_count())

    gc.unfreeze()
    try:
        with fake_upstream(FakeUpstream()) as url:
            with fleet_server([url]) as fleet:
                r = httpx.post(f"{fleet.url}/v1/completions", timeout=10,
                               json={"model": "fake", "prompt": "hi"})
                assert r.status_code == 200, r.text
                assert gc.get_freeze_count() == 0
            monkeypatch.setattr(fleet_launch, "_server", lambda app, options: Served())
            assert fleet_launch.serve_fleet(fleet_options([url])) == 0
        assert frozen_when_served and frozen_when_served[0] > 1000
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
