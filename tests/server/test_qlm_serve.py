"""`--router qlm` on the real engine: its engine policy, its counters in /metrics, and
two real checkpoints served through it with the answers each gives alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from andante.core.clock import ManualClock
from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.core.sampling import SamplingParams
from andante.runtime.worker import InstanceWorker
from andante.server import EngineOptions, ServeOptions
from andante.server.backend import build_engine_for
from andante.server.config import TOY_MODEL
from tests.server.test_multi_model import _complete, _metric, _options, _server

TOYS = (("alpha", TOY_MODEL), ("beta", TOY_MODEL))


def test_qlm_runs_its_engine_policy_and_refuses_another_in_one_line() -> None:
    assert ServeOptions(models=TOYS, router="qlm").policy == "qlm-edf"
    assert ServeOptions(models=TOYS, router="qlm", policy="qlm-edf").policy == "qlm-edf"
    assert ServeOptions(models=TOYS).policy == "vllm"
    with pytest.raises(ValueError, match=r"--router qlm needs --policy qlm-edf .*drop "
                                         r"--policy vllm") as err:
        ServeOptions(models=TOYS, router="qlm", policy="vllm")
    assert "\n" not in str(err.value)


def test_qlm_counts_its_planner_and_evictions_in_metrics() -> None:
    with _server(_options(TOYS, router="qlm")) as srv:
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda i: _complete(srv.url, TOYS[i % 2][0], f"r{i}"), range(6)))
        text = httpx.get(f"{srv.url}/metrics").text
    for name in ("planner_invocations", "planner_plans", "planner_fallbacks", "evictions",
                 "state_swaps", "swaps"):
        assert f"andante:router_{name}_total" in text, name
    assert _metric(text, "andante:router_swaps_total", router="qlm") >= 1


def test_the_worker_applies_an_eviction_at_its_next_step() -> None:
    options = ServeOptions(engine=EngineOptions(toy_step_time=0.0))
    engine, adapter, name = build_engine_for(options, 0, ManualClock(), TOY_MODEL)
    worker = InstanceWorker(0, engine, adapter, model_name=name)
    reqs = [Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=50), 0.0)
            for i in range(2)]
    for req in reqs:
        worker.submit(req)
    worker.step(0)
    assert all(r.status is RequestStatus.RUNNING for r in reqs)
    worker.evict("r1", PreemptionMode.RECOMPUTE)
    worker.step(0)
    assert reqs[1].status is not RequestStatus.RUNNING or reqs[1].timeline.preemption_times
    assert engine.scheduler.num_preemptions == 1


# ---- two real checkpoints through the QLM router ------------------------------------------

REAL = EngineOptions(num_kv_blocks=64, max_num_seqs=4, dtype="float32", num_threads=1)
PROMPTS = ["w10 w20 w30", "w5 w6 w7 w8", "w100 w200", "w42"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two real checkpoints (tiny random Llamas, Hugging Face format, real loader and
    engine): fast, and their answers differ."""
    from tests.models.helpers import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("qlm")
    return (make_tiny_checkpoint(root / "one", seed=1),
            make_tiny_checkpoint(root / "two", seed=2))


def _alone(path: Path) -> list[str]:
    options = ServeOptions(model=str(path), port=0, log_level="warning", engine=REAL)
    with _server(options) as srv:
        return [_complete(srv.url, srv.state.backend.model_name, p)["choices"][0]["text"]
                for p in PROMPTS]


@pytest.mark.slow
def test_two_real_checkpoints_through_the_qlm_router_answer_as_alone(
        checkpoints: tuple[Path, Path]) -> None:
    one, two = checkpoints
    expected = {"one": _alone(one), "two": _alone(two)}
    assert expected["one"] != expected["two"]
    models = (("one", str(one)), ("two", str(two)))
    jobs = [(("one", "two")[i % 2], i % len(PROMPTS)) for i in range(2 * len(PROMPTS))]
    with _server(_options(models, engine=REAL, router="qlm")) as srv:
        assert srv.state.options.policy == "qlm-edf"
        with ThreadPoolExecutor(len(jobs)) as pool:
            texts = list(pool.map(lambda job: _complete(
                srv.url, job[0], PROMPTS[job[1]])["choices"][0]["text"], jobs))
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert srv.state.runner.controller.num_owned == 0
    assert texts == [expected[name][k] for name, k in jobs]
    assert _metric(metrics, "andante:router_swaps_total", router="qlm") >= 1
