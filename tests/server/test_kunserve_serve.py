"""`andante serve --instances 2 --router kunserve` on a tiny model with a small KV cache:
a burst throttles both instances, the coordinator forms a pipeline group whose dropped
weights show up as more KV blocks in /metrics, every request completes, and the group
restores once the burst is over."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from andante.server import EngineOptions, ServeOptions, ServerThread
from tests.models.helpers import make_tiny_checkpoint

NUM_BLOCKS = 12  # per instance: one long request at a time
MAX_BURSTS = 4


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4"), num_hidden_layers=4)


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _blocks(metrics: str) -> float:
    found = re.search(r"^andante:num_kv_blocks\{[^}]*\} (\S+)$", metrics, re.M)
    assert found, metrics
    return float(found.group(1))


async def _burst(url: str, num: int, ok_only: bool = True) -> list[int]:
    """Completion tokens of each request (-status for a failed one if not `ok_only`)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def one(i: int) -> int:
            reply = await client.post("/v1/completions", json={
                "model": "tiny", "prompt": [10 + i] * 40, "max_tokens": 60,
                "temperature": 0, "ignore_eos": True})
            if reply.status_code != 200 and not ok_only:
                return -reply.status_code
            assert reply.status_code == 200, reply.text
            return int(reply.json()["usage"]["completion_tokens"])
        return list(await asyncio.gather(*(one(i) for i in range(num))))


def _options(tiny4: Path) -> ServeOptions:
    return ServeOptions(
        model=str(tiny4), served_model_name="tiny", port=0, log_level="warning",
        instances=2, router="kunserve",
        router_options={"check_interval": "0", "min_group_seconds": "0",
                        "restore_window_seconds": "0"},
        engine=EngineOptions(num_kv_blocks=NUM_BLOCKS, max_model_len=512,
                             swap_space_gib=0.0, max_num_seqs=16))


async def _bursts_until(url: str, formed: Callable[[], bool], on_formed: Callable[[], None],
                        watch: Callable[[], None] | None = None) -> list[int]:
    """Bursts of 10 requests, one after another (at most MAX_BURSTS), until a group has
    formed during one: on a busy machine the stages' preparation can outlast a burst. Calls
    `on_formed` once when the group is seen and `watch` every 20 ms; returns every
    request's outcome."""
    outcomes: list[int] = []
    fired = False
    for _ in range(MAX_BURSTS):
        burst = asyncio.ensure_future(_burst(url, 10, ok_only=False))
        while not burst.done():
            if watch is not None:
                watch()
            if not fired and formed():
                fired = True
                on_formed()
            await asyncio.sleep(0.02)
        outcomes += await burst
        if fired:
            return outcomes
    raise AssertionError(f"no group formed in {MAX_BURSTS} bursts")


@pytest.mark.slow
def test_burst_forms_a_group_and_restores(tiny4: Path) -> None:
    with ServerThread(_options(tiny4)) as server:
        before = _blocks(httpx.get(server.url + "/metrics").text)
        assert before == 2 * NUM_BLOCKS
        coordinator = server.state.runner.controller.operators[0]
        seen: list[float] = []

        def watch() -> None:
            seen.append(_blocks(httpx.get(server.url + "/metrics").text))

        tokens = asyncio.run(_bursts_until(
            server.url, lambda: coordinator.counters.num_drops >= 1, lambda: None, watch))
        assert tokens == [60] * len(tokens)  # none lost
        assert coordinator.counters.num_drops >= 1
        assert max(seen) > 2 * NUM_BLOCKS  # the dropped layers' weights became KV blocks
        # the coordinator checks after steps: light traffic lets it see the low usage
        deadline = time.monotonic() + 60
        while coordinator.groups.groups():
            assert time.monotonic() < deadline, "the group never restored"
            assert asyncio.run(_burst(server.url, 1)) == [60]
        assert coordinator.counters.num_restores >= 1
        _wait_for(lambda: _blocks(httpx.get(server.url + "/metrics").text) == before)


def _die(_worker: object) -> None:
    raise RuntimeError("test hook: the leader's thread dies")


@pytest.mark.slow
def test_dead_leader_loses_no_request(tiny4: Path) -> None:
    """The group's leader dies mid-burst: its partner serves alone again; the dead
    leader's requests are the controller's (re-queued on the partner if they had not
    streamed, else failed with an error): every request gets an answer."""
    with ServerThread(_options(tiny4)) as server:
        coordinator = server.state.runner.controller.operators[0]

        def kill_leader() -> None:
            leader = coordinator.groups.groups()[0].leader
            server.state.runner.instances[leader].worker.at_boundary(_die)

        outcomes = asyncio.run(_bursts_until(
            server.url, lambda: bool(coordinator.groups.groups()), kill_leader))
        completed = [n for n in outcomes if n > 0]
        failed = [n for n in outcomes if n < 0]
        assert len(completed) + len(failed) == len(outcomes)  # none lost
        assert all(n == 60 for n in completed)
        assert all(n == -500 for n in failed)  # started: failed with a clear error
        assert asyncio.run(_burst(server.url, 2)) == [60, 60]  # the partner serves


@pytest.mark.slow
def test_dead_member_makes_the_leader_restore(tiny4: Path) -> None:
    """A member dies mid-burst: the leader restores without its layers and recomputes
    every request that held KV; all of them complete."""
    with ServerThread(_options(tiny4)) as server:
        coordinator = server.state.runner.controller.operators[0]
        groups = coordinator.groups

        def kill_member() -> None:
            member = groups.groups()[0].members[1]
            server.state.runner.instances[member].worker.at_boundary(_die)

        outcomes = asyncio.run(_bursts_until(server.url, lambda: bool(groups.groups()),
                                             kill_member))
        assert outcomes == [60] * len(outcomes)
        restore = groups.restore_reports[0]
        assert restore.failed_member is not None and restore.num_recomputed >= 1
