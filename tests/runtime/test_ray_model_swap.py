"""Model swaps on Ray instances (QLM LSO 5): the same semantics as in-process ones.

The outgoing model's running requests go back to the controller and are answered exactly
once; the incoming model comes warm from host memory or cold from disk, timed, and the
driver's `model_state` follows. Real Ray actors on an embedded local Ray (skipped where
the optional extra `ray` is missing).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from andante.cluster.instance import SWAP_MODEL, MultiModel
from andante.runtime.ray_actors import RayMultiModelInstance
from andante.server import EngineOptions
from tests.server.test_multi_model import (
    PROMPTS,
    REAL,
    TOYS,
    _complete,
    _metric,
    _options,
    _server,
    _wait_until_running,
)

ray = pytest.importorskip("ray")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _ray_session() -> Any:
    yield
    ray.shutdown()


def _ray_options(**kwargs: Any) -> Any:
    return _options(TOYS, backend="ray", max_restarts=0, **kwargs)


def test_a_swap_on_a_ray_actor_hands_running_requests_back_each_answered_once() -> None:
    with _server(_ray_options(engine=EngineOptions(toy_step_time=0.01))) as srv:
        runner = srv.state.runner
        inst = runner.instances[0]
        assert isinstance(inst, RayMultiModelInstance) and isinstance(inst, MultiModel)
        assert SWAP_MODEL in inst.capabilities
        assert inst.model_state().device == "alpha"
        with pytest.raises(ValueError, match="'gamma'"):
            inst.swap_model("gamma")
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(_complete, srv.url, "alpha", f"p{i}", 40) for i in range(6)]
            _wait_until_running(runner, 6)  # alpha's requests are decoding in the actor
            futures += [pool.submit(_complete, srv.url, "beta", f"q{i}", 10) for i in range(2)]
            inst.swap_model("beta")
            assert inst.next_model() == "beta"  # pending until the actor reports it
            assert inst.model_state().device == "beta"
            bodies = [f.result() for f in futures]
        assert len({b["id"] for b in bodies}) == 8
        assert all(b["usage"]["completion_tokens"] == (40 if b["model"] == "alpha" else 10)
                   for b in bodies)
        assert runner.controller.num_handoffs >= 1  # alpha's running requests came back
        assert runner.controller.num_owned == 0 and not runner.controller.queue
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert _metric(metrics, "andante:model_swap_evicted_requests_total") >= 1
        assert _metric(metrics, "andante:model_swap_seconds_count", tier="warm") >= 1
        assert _metric(metrics, "andante:model_swap_seconds_count", tier="cold") == 0
        stats = runner.cluster_stats()["instances"][0]
        assert {stats["device_model"], *stats["warm_models"]} == {"alpha", "beta"}
        for i, body in enumerate(bodies[:6]):  # resumed text is not sent twice
            alone = _complete(srv.url, "alpha", f"p{i}", 40)
            assert body["choices"][0]["text"] == alone["choices"][0]["text"]


def test_qlm_on_ray_actors_swaps_models_and_loses_nothing() -> None:
    with _server(_ray_options(router="qlm")) as srv:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(_complete, srv.url, TOYS[i % 2][0], f"r{i}")
                       for i in range(6)]
            bodies = [f.result() for f in futures]
        assert sorted(b["model"] for b in bodies) == ["alpha"] * 3 + ["beta"] * 3
        runner = srv.state.runner
        assert runner.num_model_swaps >= 1
        assert runner.controller.num_owned == 0 and not runner.controller.queue
        metrics = httpx.get(f"{srv.url}/metrics").text
        timed = _metric(metrics, "andante:model_swap_seconds_count")
        assert timed == runner.num_model_swaps  # every swap the actor made was timed
        device, warm = runner.instances[0].models()
        assert {device, *warm} == {"alpha", "beta"}


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.models.helpers import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("ray-mm")
    return (make_tiny_checkpoint(root / "one", seed=1),
            make_tiny_checkpoint(root / "two", seed=2))


@pytest.mark.parametrize(("host_memory_gib", "tier"), [(None, "warm"), (0.0, "cold")])
def test_real_checkpoints_swap_warm_or_cold_in_a_ray_actor(
        tiny_checkpoints: tuple[Path, Path], host_memory_gib: float | None, tier: str) -> None:
    one, two = tiny_checkpoints
    models = (("one", str(one)), ("two", str(two)))
    options = _options(models, engine=REAL, backend="ray", max_restarts=0,
                       host_memory_gib=host_memory_gib)
    with _server(options) as srv:
        texts = {name: [_complete(srv.url, name, p)["choices"][0]["text"] for p in PROMPTS[:2]]
                 for name in ("one", "two", "one")}  # one, then two (a swap), then one
        metrics = httpx.get(f"{srv.url}/metrics").text
        device, warm = srv.state.runner.instances[0].models()
    assert texts["one"] != texts["two"]  # the swapped-in model's own weights answer
    assert _metric(metrics, "andante:model_swap_seconds_count", tier=tier) == 2
    assert _metric(metrics, "andante:model_swap_seconds_sum", tier=tier) > 0
    assert device == "one" and warm == (() if tier == "cold" else ("two",))
