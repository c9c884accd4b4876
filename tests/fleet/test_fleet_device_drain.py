"""A swap on a shared device waits for the streams under way, or cuts them where that
saves more deadlines than it loses (andante.runtime.upstream.device, `cut_pays`).

Two andante toy servers (--dev-mode) share the device: alpha awake, beta asleep. Alpha
streams run; a swap to beta is asked (as QLM asks it); beta requests are parked behind
it with tight deadlines."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from andante.server.fleet_launch import FleetServerThread
from tests.fleet.test_fleet_device_faults import Answer, _device_fleet, _stream, _until


async def _swap_under_streams(server: FleetServerThread, num_alpha: int, alpha_tokens: int,
                              num_beta: int, beta_deadline: float
                              ) -> tuple[list[Answer], list[Answer]]:
    fleet = server.fleet
    awake = fleet.upstreams[0]
    async with httpx.AsyncClient(timeout=120) as client:
        alphas = [asyncio.create_task(_stream(client, server.url, "alpha", alpha_tokens))
                  for _ in range(num_alpha)]
        await _until(lambda: len(awake.started) == num_alpha, "alpha streams to start")
        loop = fleet._poller.get_loop()
        loop.call_soon_threadsafe(fleet.devices[0].swap_model, "beta")
        betas = [asyncio.create_task(_stream(client, server.url, "beta", 10, beta_deadline))
                 for _ in range(num_beta)]
        done, pending = await asyncio.wait([*alphas, *betas], timeout=90)
        assert not pending, "a request waited forever"
        return [t.result() for t in alphas], [t.result() for t in betas]


@pytest.mark.slow
def test_a_swap_cuts_a_long_stream_for_more_parked_deadlines() -> None:
    with _device_fleet() as (ups, server):
        alphas, betas = asyncio.run(_swap_under_streams(server, 1, 3000, 3, 4.0))
        device = server.fleet.devices[0]
        assert device.num_cut == 1 and device.num_swaps == 1
        (alpha,) = alphas  # evicted: an error event ends its stream, once
        assert alpha.status == 200 and alpha.error and alpha.dones <= 1, alpha
        assert alpha.tokens < 3000, alpha
        for answer in betas:
            assert answer.status == 200 and answer.tokens == 10 and not answer.error, answer


@pytest.mark.slow
def test_a_swap_waits_for_streams_that_outnumber_the_deadlines_it_would_save() -> None:
    with _device_fleet() as (ups, server):
        alphas, betas = asyncio.run(_swap_under_streams(server, 3, 150, 1, 1.0))
        device = server.fleet.devices[0]
        assert device.num_cut == 0 and device.num_swaps == 1
        for answer in alphas:  # finished whole, then the swap
            assert answer.status == 200 and answer.tokens == 150 and not answer.error, answer
        (beta,) = betas  # late, but served
        assert beta.status == 200 and beta.tokens == 10 and not beta.error, beta
