"""The fleet's edge against scripted upstreams: SLO forwarding, retries of 429/5xx
elsewhere, bad input at start and per request."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from andante.runtime.upstream.discovery import FleetError, UpstreamSpec, discover
from tests.fleet.helpers import ENV, FakeUpstream, fake_upstream, fleet_server


def test_slo_forwarded_per_upstream_kind() -> None:
    vllm = FakeUpstream()
    andante = FakeUpstream(models=[{"id": "fake", "owned_by": "andante"}])
    with fake_upstream(vllm) as a, fake_upstream(andante) as b, \
            fleet_server([a, b], router="round-robin") as fleet:
        for slo_field in ({"slo": {"ttft": 0.5, "deadline": 20}},
                          {"vllm_xargs": {"ttft": 0.5, "deadline": 20}}):
            for _ in range(2):
                r = httpx.post(f"{fleet.url}/v1/completions", timeout=10,
                               json={"model": "fake", "prompt": "hi", **slo_field})
                assert r.status_code == 200, r.text
    assert len(vllm.bodies) == len(andante.bodies) == 2
    for body in vllm.bodies:
        assert body["vllm_xargs"] == {"ttft": 0.5, "deadline": 20.0} and "slo" not in body
    for body in andante.bodies:
        assert body["slo"] == {"ttft": 0.5, "deadline": 20.0} and "vllm_xargs" not in body


def test_a_body_without_anything_to_rewrite_goes_as_sent() -> None:
    """Byte for byte (no second serialization on the proxy's path); one with an SLO or
    without its model is rewritten."""
    fake = FakeUpstream()
    sent = (b'{ "prompt" : "caf\\u00e9", "model": "fake", "extra": [1, 2.50],'
            b' "max_tokens": 3 }')
    with fake_upstream(fake) as a, fleet_server([a]) as fleet:
        for body in (sent, b'{"prompt": "x"}', b'{"model": "fake", "slo": {"ttft": 1}}',
                     b'{"prompt": "y", "model": null}'):
            r = httpx.post(f"{fleet.url}/v1/completions", timeout=10, content=body,
                           headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
    assert fake.raw_bodies[0] == sent
    assert fake.bodies[1] == {"prompt": "x", "model": "fake"}
    assert fake.bodies[2] == {"model": "fake", "vllm_xargs": {"ttft": 1.0}}
    assert fake.bodies[3] == {"prompt": "y", "model": "fake"}  # a null model is filled in


def test_429_and_5xx_are_retried_elsewhere() -> None:
    busy = FakeUpstream(statuses=[429, 503])
    calm = FakeUpstream()
    with fake_upstream(busy) as a, fake_upstream(calm) as b, \
            fleet_server([a, b], router="round-robin") as fleet:
        for _ in range(4):
            r = httpx.post(f"{fleet.url}/v1/completions", timeout=10,
                           json={"model": "fake", "prompt": "hi"})
            assert r.status_code == 200, r.text
        stats = httpx.get(f"{fleet.url}/api/stats").json()
    assert stats["retries"] == 2
    assert len(busy.bodies) + len(calm.bodies) == 6  # 4 served, 2 refused then retried


def test_refusals_everywhere_reach_the_client_at_the_deadline() -> None:
    fake = FakeUpstream(statuses=[503] * 100)
    with fake_upstream(fake) as a, fleet_server([a], max_attempts=3) as fleet:
        r = httpx.post(f"{fleet.url}/v1/completions", timeout=20,
                       json={"model": "fake", "prompt": "hi"})
    assert r.status_code == 503 and "scripted 503" in r.text
    assert len(fake.bodies) == 3


def test_unserved_model_is_a_404_naming_the_served_ones() -> None:
    with fake_upstream(FakeUpstream()) as a, fleet_server([a]) as fleet:
        r = httpx.post(f"{fleet.url}/v1/completions", json={"model": "gpt-9", "prompt": "x"})
        assert r.status_code == 404
        assert "'gpt-9'" in r.json()["error"]["message"]
        assert "served models: fake" in r.json()["error"]["message"]
        bad = httpx.post(f"{fleet.url}/v1/completions", content=b"[1]",
                         headers={"content-type": "application/json"})
        assert bad.status_code == 400
        slo = httpx.post(f"{fleet.url}/v1/completions",
                         json={"model": "fake", "prompt": "x", "slo": {"ttft": -1}})
        assert slo.status_code == 400 and "slo" in slo.text


def _discover(urls: list[str]) -> None:
    asyncio.run(discover([UpstreamSpec(u) for u in urls], timeout=2.0))


def test_startup_refuses_bad_fleets() -> None:
    with fake_upstream(FakeUpstream(models=[])) as empty, \
            pytest.raises(FleetError, match="serves no model"):
        _discover([empty])
    twice = FakeUpstream(models=[{"id": "llama", "root": "/w/llama"}])
    other = FakeUpstream(models=[{"id": "llama-8b", "root": "/w/llama"}])
    with fake_upstream(twice) as a, fake_upstream(other) as b, \
            pytest.raises(FleetError, match="served as 'llama' by .* and as 'llama-8b'"):
        _discover([a, b])
    with pytest.raises(FleetError, match="unreachable"):
        _discover(["http://127.0.0.1:9"])


def test_cli_prints_one_line_for_an_unreachable_upstream() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "andante.cli.main", "serve", "--upstream",
         "http://127.0.0.1:9", "--port", "0"], capture_output=True, text=True, timeout=60,
        env=ENV)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "upstream http://127.0.0.1:9 is unreachable" in lines[0]
