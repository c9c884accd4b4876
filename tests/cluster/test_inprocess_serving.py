"""`andante serve --instances N`: in-process instances behind the controller."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from andante.runtime.local import LocalInstance
from andante.server import ServerThread
from andante.server.backend import instance_plans
from andante.server.runner import ClusterRunner
from tests.cluster.serving import cluster_options, stream_many


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "power-of-two", "ascendra",
                                    "cache-aware"])
def test_every_request_completes_across_instances(router: str) -> None:
    with ServerThread(cluster_options(router=router)) as srv:
        outcomes = asyncio.run(stream_many(srv.url, 12, 20, asyncio.Event()))
        assert all(o.status == 200 and o.finish == "length" and not o.error for o in outcomes)
        assert all(o.text.startswith("The quick brown fox") for o in outcomes)
        stats = httpx.get(f"{srv.url}/api/stats").json()["cluster"]
        assert stats["router"] == router and len(stats["instances"]) == 3
        assert sum(i["num_received"] for i in stats["instances"]) == 12
        runner = srv.state.runner
        assert isinstance(runner, ClusterRunner) and runner.controller.num_owned == 0
        assert httpx.get(f"{srv.url}/health").status_code == 200
        if router == "ascendra":
            assert [i["role"] for i in stats["instances"]] == ["lp", "lp", "hp"]
            assert stats["num_ticketed"] >= 1


def test_ascendra_plans_pools_and_options() -> None:
    plans = instance_plans(cluster_options(4, router="ascendra", hp_instances=2,
                                           policy_options={"lp.value": "sjf"}))
    assert [p.role for p in plans] == ["lp", "lp", "hp", "hp"]
    assert plans[0].policy_options == {"value": "sjf"} and plans[2].policy_options == {}
    with pytest.raises(ValueError, match="hp_instances"):
        instance_plans(cluster_options(2, router="ascendra", hp_instances=2))
    with pytest.raises(ValueError, match="lp."):
        instance_plans(cluster_options(3, router="ascendra", policy_options={"value": 1}))


def test_a_failed_instance_requeues_waiting_requests_and_fails_started_ones() -> None:
    with ServerThread(cluster_options(2, step_time=0.01, max_num_seqs=2)) as srv:
        runner = srv.state.runner
        assert isinstance(runner, ClusterRunner)
        local = runner.instances[0]
        assert isinstance(local, LocalInstance)
        broken = local.worker.engine.executor
        steps = {"n": 0}
        execute = broken.execute

        def failing(batch):  # type: ignore[no-untyped-def]
            steps["n"] += 1
            if steps["n"] > 5:
                raise RuntimeError("GPU fell off the bus")
            return execute(batch)

        broken.execute = failing  # type: ignore[method-assign]
        outcomes = asyncio.run(stream_many(srv.url, 8, 30, asyncio.Event()))
        done = [o for o in outcomes if o.finish == "length"]
        failed = [o for o in outcomes if o.error]
        assert len(done) + len(failed) == 8  # every request completes or fails clearly
        assert failed and all("failed" in (o.error or "") for o in failed)
        assert all(o.num_chunks >= 1 for o in failed)  # only ones that had started
        assert runner.controller.num_requeued >= 1  # the waiting ones moved over
        assert not runner.instances[0].alive and runner.is_alive
        again = asyncio.run(stream_many(srv.url, 3, 5, asyncio.Event()))
        assert all(o.finish == "length" for o in again)  # the survivor serves the rest
