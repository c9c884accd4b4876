"""Several models behind one server, with model swaps (QLM LSO 5 on the real engine)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from andante.cli.serve import parse_models
from andante.cluster.qlm.tiers import ModelTiers, first_that_fit
from andante.core.request import Request, RequestStatus
from andante.core.sampling import SamplingParams
from andante.runtime.worker import InstanceWorker, ModelSwitch, StepMessage
from andante.server import EngineOptions, ServeOptions, ServerThread
from andante.server.backend import build_engine_for
from andante.server.config import TOY_MODEL


def _options(models: tuple[tuple[str, str | None], ...], **kwargs: Any) -> ServeOptions:
    engine = kwargs.pop("engine", EngineOptions(toy_step_time=0.002))
    return ServeOptions(models=models, port=0, log_level="warning", engine=engine, **kwargs)


@contextmanager
def _server(options: ServeOptions) -> Iterator[ServerThread]:
    server = ServerThread(options).start()
    try:
        yield server
    finally:
        server.stop()


def _complete(url: str, model: str, prompt: str, max_tokens: int = 8) -> dict[str, Any]:
    reply = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


TOYS = (("alpha", TOY_MODEL), ("beta", TOY_MODEL))


def test_models_are_listed_and_an_unknown_one_is_a_404_naming_them() -> None:
    with _server(_options(TOYS)) as srv:
        listed = httpx.get(f"{srv.url}/v1/models").json()["data"]
        assert [m["id"] for m in listed] == ["alpha", "beta"]
        reply = httpx.post(f"{srv.url}/v1/completions",
                           json={"model": "gamma", "prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 404
        error = reply.json()["error"]
        assert error["code"] == "model_not_found"
        assert "'alpha'" in error["message"] and "'beta'" in error["message"]


def test_alternating_models_on_one_instance_swap_and_all_complete() -> None:
    with _server(_options(TOYS)) as srv:
        for i in range(6):
            model = TOYS[i % 2][0]
            body = _complete(srv.url, model, f"request {i}")
            assert body["model"] == model
            assert body["usage"]["completion_tokens"] == 8
        metrics = httpx.get(f"{srv.url}/metrics").text
        # alpha starts on the device: beta, alpha, beta, alpha, beta swapped in
        assert _metric(metrics, "andante:model_swaps_total", model_name="beta") == 3
        assert _metric(metrics, "andante:model_swaps_total", model_name="alpha") == 2
        assert _metric(metrics, "andante:model_swap_seconds_count", tier="warm") == 5
        stats = srv.state.runner.cluster_stats()
        assert stats["model_swaps"] == 5
        assert stats["instances"][0]["device_model"] == "beta"
        assert stats["instances"][0]["warm_models"] == ("alpha",)


def test_each_instance_starts_with_its_own_model_and_requests_go_there() -> None:
    with _server(_options(TOYS, instances=2)) as srv:
        for i in range(4):
            _complete(srv.url, TOYS[i % 2][0], f"r{i}")
        stats = srv.state.runner.cluster_stats()
        assert [inst["device_model"] for inst in stats["instances"]] == ["alpha", "beta"]
        assert stats["model_swaps"] == 0  # each model had an instance on its device


def _wait_until_running(runner: Any, num: int, timeout: float = 30.0) -> None:
    """Until instance 0 reports `num` running requests (the order of arrivals matters:
    a request for the other model on an idle instance would swap it at once)."""
    deadline = time.monotonic() + timeout
    while runner.cluster_stats()["instances"][0]["stats"]["num_running"] < num:
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.005)


def test_a_swap_while_requests_run_requeues_them_and_each_is_answered_once() -> None:
    slow = EngineOptions(toy_step_time=0.01)
    with _server(_options(TOYS, engine=slow)) as srv:
        runner = srv.state.runner
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(_complete, srv.url, "alpha", f"p{i}", 40) for i in range(6)]
            _wait_until_running(runner, 6)  # alpha's requests are decoding
            futures += [pool.submit(_complete, srv.url, "beta", f"q{i}", 10) for i in range(2)]
            srv.state.runner.instances[0].swap_model("beta")
            bodies = [f.result() for f in futures]
        ids = [b["id"] for b in bodies]
        assert len(set(ids)) == 8
        assert all(b["usage"]["completion_tokens"] == (40 if b["model"] == "alpha" else 10)
                   for b in bodies)
        assert runner.controller.num_handoffs >= 1  # alpha's running requests came back
        assert runner.controller.num_owned == 0 and not runner.controller.queue
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert _metric(metrics, "andante:model_swap_evicted_requests_total") >= 1
        # a resumed request's text is not sent twice: as a request served without a swap
        for i, body in enumerate(bodies[:6]):
            alone = _complete(srv.url, "alpha", f"p{i}", 40)
            assert body["choices"][0]["text"] == alone["choices"][0]["text"]


def _toy_worker(models: tuple[str, ...], host_cap: int | None = None,
                cold: tuple[str, ...] = ()) -> InstanceWorker:
    options = _options(tuple((m, TOY_MODEL) for m in models))
    from andante.core.clock import MonotonicClock

    clock = MonotonicClock()

    def build(model: str, _: Any) -> Any:
        engine, adapter, _name = build_engine_for(options, 0, clock, TOY_MODEL)
        return engine, adapter

    sizes = dict.fromkeys(models, 1)
    warm = first_that_fit((m for m in models[1:] if m not in cold), sizes, host_cap)
    tiers = ModelTiers(sizes, models[0], host_capacity_bytes=host_cap, host=warm,
                       weights={m: object() for m in (models[0], *warm)})
    engine, adapter = build(models[0], None)
    costs = {m: engine.executor.cost_model for m in models}
    return InstanceWorker(0, engine, adapter, model_name=models[0],
                          switch=ModelSwitch(tiers, build, lambda m: object(), costs))


def _request(rid: str, model: str, max_tokens: int = 20) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   0.0, model=model)


def test_worker_swap_hands_back_running_requests_with_their_output_exactly_once() -> None:
    worker = _toy_worker(("a", "b"))
    for i in range(3):
        worker.submit(_request(f"a{i}", "a"))
    messages: list[StepMessage] = []
    for _ in range(3):
        messages.append(worker.step(0))
    worker.swap_model("b")
    messages.append(worker.step(0))
    swap = messages[-1].swaps
    assert [(s.outgoing, s.incoming, s.tier, s.num_evicted) for s in swap] == \
        [("a", "b", "warm", 3)]
    handed = messages[-1].handoffs
    assert sorted(r.request_id for r in handed) == ["a0", "a1", "a2"]
    assert all(r.status == RequestStatus.PREEMPTED and r.num_output_tokens > 0 for r in handed)
    assert worker.models() == ("b", ("a",))
    # handed back to the same worker: parked (b on device, engine dry), swapped back in
    for req in handed:
        worker.submit(req)
    finished: list[str] = []
    for _ in range(200):
        message = worker.step(0)
        if message is not None:
            finished += message.finished_ids
            assert not message.handoffs
        if len(finished) == 3:
            break
    assert sorted(finished) == ["a0", "a1", "a2"]
    assert worker.models()[0] == "a"


def test_a_model_over_the_host_budget_is_cold() -> None:
    worker = _toy_worker(("a", "b", "c"), host_cap=1)  # one warm copy fits
    assert worker.models() == ("a", ("b",))
    worker.swap_model("c")
    message = worker.step(0)
    assert message is not None and [s.tier for s in message.swaps] == ["cold"]
    assert worker.models() == ("c", ("a",))  # a stays warm; b, used least recently: cold


def test_warm_start_reads_a_cold_model_into_host_memory_off_the_stepping_thread() -> None:
    worker = _toy_worker(("a", "b", "c"), cold=("c",))
    assert worker.models() == ("a", ("b",))
    worker.warm_model("c")
    for _ in range(100):
        worker.step(0.05)
        if "c" in worker.models()[1]:
            break
    assert worker.models() == ("a", ("b", "c"))
    worker.swap_model("c")
    message = worker.step(0)
    assert message is not None and [s.tier for s in message.swaps] == ["warm"]


def test_unknown_model_for_a_swap_is_a_value_error() -> None:
    worker = _toy_worker(("a", "b"))
    with pytest.raises(ValueError, match="'z'.*'a', 'b'"):
        worker.swap_model("z")


@pytest.mark.parametrize(("items", "expected"), [
    (None, (None, ())),
    (["some/path"], ("some/path", ())),
    (["a=x", "b="], (None, (("a", "x"), ("b", None)))),
])
def test_parse_models(items: list[str] | None, expected: Any) -> None:
    assert parse_models(items) == expected


@pytest.mark.parametrize(("items", "match"), [
    (["x", "y"], "NAME=PATH"), (["a=x", "y"], "NAME="),
])
def test_parse_models_refuses_mixed_or_unnamed(items: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_models(items)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"models": (("a", None), ("a", None))}, "unique"),
    ({"models": (("", None),)}, "name"),
    ({"models": (("a", None),), "host_memory_gib": -1.0}, "host_memory_gib"),
])
def test_bad_multi_model_options(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ServeOptions(**kwargs)


# ---- real (tiny random Llama) checkpoints -----------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.models.helpers import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("mm")
    return (make_tiny_checkpoint(root / "one", seed=1),
            make_tiny_checkpoint(root / "two", seed=2))


REAL = EngineOptions(num_kv_blocks=64, max_num_seqs=4, dtype="float32", num_threads=1)
PROMPTS = ["w10 w20 w30", "w5 w6 w7 w8", "w100 w200", "w42"]


def _single(path: Path) -> list[str]:
    options = ServeOptions(model=str(path), port=0, log_level="warning", engine=REAL)
    with _server(options) as srv:
        return [_complete(srv.url, srv.state.backend.model_name, p)["choices"][0]["text"]
                for p in PROMPTS]


@pytest.mark.slow
@pytest.mark.parametrize("host_memory_gib", [None, 0.0])
def test_real_models_alternate_with_the_right_outputs(
        checkpoints: tuple[Path, Path], host_memory_gib: float | None) -> None:
    one, two = checkpoints
    expected = {"one": _single(one), "two": _single(two)}
    assert expected["one"] != expected["two"] and all(expected["one"])
    models = (("one", str(one)), ("two", str(two)))
    with _server(_options(models, engine=REAL, host_memory_gib=host_memory_gib)) as srv:
        for i, prompt in enumerate(PROMPTS * 2):
            name = ("one", "two")[i % 2]
            text = _complete(srv.url, name, prompt)["choices"][0]["text"]
            assert text == expected[name][i % len(PROMPTS)]
        metrics = httpx.get(f"{srv.url}/metrics").text
    tier = "warm" if host_memory_gib is None else "cold"
    assert _metric(metrics, "andante:model_swap_seconds_count", tier=tier) == 7
    assert _metric(metrics, "andante:model_swap_seconds_sum", tier=tier) > 0


def test_qlm_router_serves_several_models_with_swaps() -> None:
    with _server(_options(TOYS, router="qlm")) as srv:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(_complete, srv.url, TOYS[i % 2][0], f"r{i}")
                       for i in range(6)]
            bodies = [f.result() for f in futures]
        assert sorted(b["model"] for b in bodies) == ["alpha"] * 3 + ["beta"] * 3
        assert srv.state.runner.num_model_swaps >= 1
        assert srv.state.runner.controller.num_owned == 0


class _Holder:
    def __init__(self, device: str, drain: float) -> None:
        self.device, self.coming = device, None
        self.alive, self.role, self.num_sent = True, "", 0
        from andante.cluster.load import LoadReport

        self.load = LoadReport(drain_time=drain)

    def device_model(self) -> str:
        return self.device

    def next_model(self) -> str | None:
        return self.coming


class _View:
    def __init__(self, index: int, holder: _Holder) -> None:
        self.index, self.holder = index, holder
        self.role = ""

    @property
    def alive(self) -> bool:
        return True

    @property
    def load(self) -> Any:
        return self.holder.load

    @property
    def num_in_transit(self) -> int:
        return self.holder.num_sent - self.holder.load.num_received


def test_model_router_places_by_model_and_never_stacks_swaps() -> None:
    from andante.cluster.qlm.model_router import ModelRouter
    from andante.cluster.router import RoundRobinRouter

    holders = [_Holder("a", 5.0), _Holder("a", 1.0), _Holder("b", 0.0)]
    views = [_View(i, h) for i, h in enumerate(holders)]
    router = ModelRouter(RoundRobinRouter(), holders)
    # model a: round robin over the two instances holding it
    assert [router.route(_request(f"r{i}", "a"), views) for i in range(4)] == [0, 1, 0, 1]
    assert router.route(_request("b0", "b"), views) == 2
    # model c on no device: the least-loaded instance swaps (1), and while that swap is
    # pending (sent, not yet taken in) another c request joins it
    holders[2].load = dataclass_replace(holders[2].load, drain_time=9.0)
    holders[1].num_sent = 1
    assert router.route(_request("c0", "c"), views) == 1
    assert router.route(_request("c1", "c"), views) == 1
    # instance 1 is pending: model a goes to instance 0 only
    assert router.route(_request("a9", "a"), views) == 0
    # a model d request must not stack a second swap on instance 1
    assert router.route(_request("d0", "d"), views) == 0
    # once taken in and the parked request gone (aborted), instance 1 serves a again
    holders[1].load = dataclass_replace(holders[1].load, num_received=1)
    holders[0].coming = "d"
    assert router.route(_request("a10", "a"), views) == 1
