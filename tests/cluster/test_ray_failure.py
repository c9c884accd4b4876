"""Ray backend: one actor per instance; killing one mid-run loses no request.

Needs the optional extra `ray` (installed by scripts/bootstrap.sh, so it runs in CI on an
embedded local Ray); skipped where it is missing.
"""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from andante.runtime.ray_actors import RayInstance
from andante.server import ServerThread
from andante.server.runner import ClusterRunner
from tests.cluster.serving import cluster_options, stream_many

ray = pytest.importorskip("ray")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_server():  # type: ignore[no-untyped-def]
    options = cluster_options(2, step_time=0.02, max_num_seqs=4, backend="ray",
                              max_restarts=2)
    with ServerThread(options) as srv:
        yield srv
    ray.shutdown()


def _wait_until(condition, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_two_ray_instances_serve(ray_server: ServerThread) -> None:
    outcomes = asyncio.run(stream_many(ray_server.url, 6, 10, asyncio.Event()))
    assert all(o.finish == "length" and o.num_chunks >= 1 for o in outcomes)
    stats = httpx.get(f"{ray_server.url}/api/stats").json()["cluster"]
    assert [i["alive"] for i in stats["instances"]] == [True, True]
    assert sum(i["num_received"] for i in stats["instances"]) == 6


def test_killing_an_actor_mid_run_loses_no_request(ray_server: ServerThread) -> None:
    runner = ray_server.state.runner
    assert isinstance(runner, ClusterRunner)
    victim = runner.instances[0]
    assert isinstance(victim, RayInstance)

    async def scenario() -> list:  # type: ignore[type-arg]
        started = asyncio.Event()
        task = asyncio.create_task(stream_many(ray_server.url, 16, 40, started))
        await started.wait()  # tokens are flowing: some requests are mid-stream
        await asyncio.sleep(0.2)
        ray.kill(victim.actor, no_restart=False)  # Ray restarts it (max_restarts)
        return await task

    outcomes = asyncio.run(scenario())
    done = [o for o in outcomes if o.finish == "length" and not o.error]
    failed = [o for o in outcomes if o.error]
    assert len(done) + len(failed) == 16  # completed or a clear error: none lost
    assert all(o.num_chunks == 40 for o in done)
    assert all("failed" in (o.error or "") for o in failed)
    assert runner.controller.num_requeued >= 1  # the ones still waiting moved over
    _wait_until(lambda: victim.alive)  # the restarted actor serves again
    again = asyncio.run(stream_many(ray_server.url, 4, 5, asyncio.Event()))
    assert all(o.finish == "length" for o in again)
    assert runner.controller.num_owned == 0
