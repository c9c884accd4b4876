"""A shared device's sleeping server is killed (kill -9) and restarted on its port.

While it is down, the device's awake model is routed as before (its requests are
answered), and a request for the down model waits for its deadline (503 when that
passes). The restarted server comes back awake, as any fresh server does: the fleet puts
it to sleep before it routes anything to it (two awake servers on one GPU would run out
of memory), and then its model is served again through a swap.

Two andante toy servers (--dev-mode) share the device: alpha awake, beta asleep."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from andante.runtime.upstream.discovery import UpstreamSpec
from andante.runtime.upstream.fleet import FleetOptions
from andante.server.fleet_app import FleetServeOptions
from andante.server.fleet_launch import FleetServerThread
from tests.fleet.helpers import Upstream, start_toy
from tests.fleet.test_fleet_device_faults import _stream

WAIT_S = 20.0


def _toy(name: str, port: int = 0) -> Upstream:
    return start_toy(4.0, "--dev-mode", "--served-model-name", name, "--port", str(port))


@contextmanager
def _device_fleet() -> Iterator[tuple[list[Upstream], FleetServerThread]]:
    ups: list[Upstream] = []
    try:
        ups += [_toy("alpha"), _toy("beta")]
        specs = tuple(UpstreamSpec(u.url, device="gpu0", max_num_seqs=8) for u in ups)
        options = FleetServeOptions(specs, FleetOptions(router="qlm", poll_interval=0.1,
                                                        probe_timeout=0.5, down_after=2),
                                    port=0, log_level="warning")
        with FleetServerThread(options) as server:
            yield ups, server
    finally:
        for up in ups:
            if up.proc.poll() is None:
                up.proc.terminate()
                up.proc.wait(15)


def _until(check: object, what: str) -> None:
    started = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - started < WAIT_S, f"timed out waiting for {what}"
        time.sleep(0.01)


def _sleeping(url: str) -> bool:
    return bool(httpx.get(f"{url}/is_sleeping", timeout=5).json()["is_sleeping"])


async def _while_beta_is_down(url: str) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        alphas = [_stream(client, url, "alpha", 10) for _ in range(3)]
        late_beta = _stream(client, url, "beta", 10, deadline=1.0)
        *answers, late = await asyncio.gather(*alphas, late_beta)
    for answer in answers:  # the awake model is served while the sleeping server is down
        assert answer.status == 200 and answer.tokens == 10 and not answer.error, answer
    assert late.status == 503, late  # waited for its deadline, then a clear refusal


@pytest.mark.slow
def test_a_killed_sleeping_server_restarts_awake_and_is_put_back_to_sleep() -> None:
    with _device_fleet() as (ups, server):
        fleet = server.fleet
        beta = fleet.upstreams[1]
        assert _sleeping(ups[1].url) and not _sleeping(ups[0].url)
        os.kill(ups[1].proc.pid, signal.SIGKILL)
        ups[1].proc.wait(10)
        _until(lambda: not beta.alive, "the killed server marked down")
        assert fleet.devices[0].alive  # the awake server still serves its model
        asyncio.run(_while_beta_is_down(server.url))
        assert beta.info.models == ("beta",)

        port = int(ups[1].url.rsplit(":", 1)[1])
        ups[1] = _toy("beta", port)  # a fresh server: awake
        _until(lambda: beta.alive, "the restarted server back in the fleet")
        # routed to only once asleep again: never two awake servers on the device
        assert _sleeping(ups[1].url) and not _sleeping(ups[0].url)

        async def beta_after() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                answer = await _stream(client, server.url, "beta", 10)
            assert answer.status == 200 and answer.tokens == 10 and not answer.error, answer

        asyncio.run(beta_after())  # served through a swap
        assert _sleeping(ups[0].url) and not _sleeping(ups[1].url)
        assert fleet.devices[0].num_swaps == 1 and not fleet.held and not fleet.calls
