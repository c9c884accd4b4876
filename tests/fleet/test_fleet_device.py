"""Two andante toy upstreams (--dev-mode) sharing one device: QLM swaps their models
through /sleep and /wake_up, and no request for the sleeping model fails."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from andante.runtime.upstream.discovery import FleetError, UpstreamSpec
from andante.runtime.upstream.fleet import FleetOptions
from andante.server.fleet_app import FleetServeOptions
from andante.server.fleet_launch import FleetServerThread
from tests.fleet.helpers import start_toy, toy_upstreams


def _options(urls: list[str], router: str = "qlm") -> FleetServeOptions:
    specs = tuple(UpstreamSpec(u, device="gpu0", max_num_seqs=8) for u in urls)
    return FleetServeOptions(specs, FleetOptions(router=router, poll_interval=0.1),
                             port=0, log_level="warning")


def _ask(url: str, model: str) -> int:
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": model, "prompt": "hi", "max_tokens": 8, "ignore_eos": True, "stream": True,
        "slo": {"deadline": 30}})
    return r.status_code if "data: [DONE]" in r.text else -1


def _sleeping(url: str) -> bool:
    return bool(httpx.get(f"{url}/is_sleeping").json()["is_sleeping"])


def test_models_on_one_device_swap() -> None:
    ups = []
    try:
        for name in ("alpha", "beta"):
            ups.append(start_toy(2.0, "--dev-mode", "--served-model-name", name))
        urls = [u.url for u in ups]
        with FleetServerThread(_options(urls)) as server:
            device = server.fleet.devices[0]
            assert [_sleeping(u) for u in urls] == [False, True]  # settled at start
            models = ["beta", "alpha", "beta", "alpha"] * 3
            with ThreadPoolExecutor(6) as pool:
                statuses = list(pool.map(lambda m: _ask(server.url, m), models))
            assert statuses == [200] * len(models)
            assert device.num_swaps >= 1
            awake = [not _sleeping(u) for u in urls]
            assert awake.count(True) == 1
            assert device.model == ("alpha", "beta")[awake.index(True)]
            assert _ask(server.url, device.model) == 200
            other = "alpha" if device.model == "beta" else "beta"
            assert _ask(server.url, other) == 200 and device.model == other
    finally:
        for up in ups:
            up.proc.terminate()
            up.proc.wait(15)


def test_a_device_needs_sleep_mode_and_qlm() -> None:
    # no --dev-mode: no /is_sleeping
    with toy_upstreams(2) as ups, pytest.raises(FleetError, match="no sleep mode"):
        FleetServerThread(_options([u.url for u in ups]))
    ups2 = []
    try:
        for name in ("alpha", "beta"):
            ups2.append(start_toy(2.0, "--dev-mode", "--served-model-name", name))
        with pytest.raises(FleetError, match="use --router qlm"):
            FleetServerThread(_options([u.url for u in ups2], router="least-loaded"))
    finally:
        for up in ups2:
            up.proc.terminate()
            up.proc.wait(15)
