"""Sleep mode on andante's server (--dev-mode): vLLM's /sleep, /wake_up, /is_sleeping."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from andante.engine import Engine
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_pipeline import device_kv_bytes, pipeline_executor
from andante.runtime.local import LocalInstance
from andante.server import ServeOptions, ServerThread
from andante.server.toy import ToyExecutor
from tests.models.helpers import make_tiny_checkpoint
from tests.server.helpers import toy_options


def _executors(server: ServerThread) -> list[ToyExecutor]:
    state = server.state
    return [inst.worker.engine.executor for inst in state.runner.instances]


def _complete(url: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=30,
                      json={"prompt": "hi", "max_tokens": max_tokens, "ignore_eos": True})


@pytest.fixture(scope="module")
def dev_server() -> Iterator[ServerThread]:
    options = dataclasses.replace(toy_options(toy_step_time=0.01), dev_mode=True)
    server = ServerThread(options).start()
    yield server
    server.stop()


def test_sleep_wake_cycle(dev_server: ServerThread) -> None:
    url = dev_server.url
    assert _complete(url).status_code == 200
    for level in (1, 2):
        assert httpx.post(f"{url}/sleep", params={"level": level}).status_code == 200
        assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
        assert all(e.sleeping == level for e in _executors(dev_server))
        refused = _complete(url)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "sleeping"
        assert httpx.post(f"{url}/sleep", params={"level": level}).status_code == 200  # no-op
        assert httpx.post(f"{url}/wake_up").status_code == 200
        assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
        assert all(e.sleeping is None for e in _executors(dev_server))
        answer = _complete(url)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"]
    assert httpx.post(f"{url}/wake_up").status_code == 200  # awake already: a no-op
    assert httpx.post(f"{url}/sleep", params={"level": 3}).status_code == 400


def test_sleep_lets_requests_in_flight_finish(dev_server: ServerThread) -> None:
    url = dev_server.url
    results: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: results.append(_complete(url, 60)))
    worker.start()
    deadline = time.monotonic() + 30
    while not dev_server.state.hub.num_in_flight:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.005)
    assert httpx.post(f"{url}/sleep", params={"level": 1}, timeout=30).status_code == 200
    worker.join(30)
    assert results[0].status_code == 200  # 60 tokens of 10 ms: it ran past the sleep call
    assert results[0].json()["usage"]["completion_tokens"] == 60
    httpx.post(f"{url}/wake_up")


def test_no_sleep_endpoints_without_dev_mode() -> None:
    server = ServerThread(toy_options()).start()
    try:
        assert httpx.post(f"{server.url}/sleep").status_code == 404
        assert httpx.get(f"{server.url}/is_sleeping").status_code == 404
    finally:
        server.stop()


def test_dev_mode_needs_in_process_engines() -> None:
    with pytest.raises(ValueError, match="--backend inprocess"):
        dataclasses.replace(toy_options(), dev_mode=True, backend="process")


@pytest.fixture(scope="module")
def tiny_dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    options = ServeOptions(model=str(path), served_model_name="tiny", port=0,
                           log_level="warning", dev_mode=True)
    with ServerThread(options) as server:
        yield server


def _engine(server: ServerThread) -> Engine:
    inst = server.state.runner.instances[0]
    assert isinstance(inst, LocalInstance)
    return inst.worker.engine


def _greedy(url: str, prompt: list[int]) -> str:
    answer = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0,
        "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["choices"][0]["text"]
    return text


def test_torch_model_sleeps_and_answers_the_same_after_waking(
        tiny_dev_server: ServerThread) -> None:
    """The torch executor releases its KV cache (level 1) and its weights too (level 2);
    woken, it answers every prompt token for token as before, prefix-cached or not."""
    url = tiny_dev_server.url
    prompts = [[5] * 40, list(range(10, 60))]
    before = [_greedy(url, p) for p in prompts]
    assert all(before) and before[0] != before[1]
    for level in (1, 2):
        assert httpx.post(f"{url}/sleep", params={"level": level}).status_code == 200
        assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
        executor = _engine(tiny_dev_server).executor
        assert isinstance(executor, TorchExecutor) and executor.sleeping == level
        assert executor.kv.device.numel() == 0
        assert (not executor.model.weights.layers) is (level == 2)
        assert httpx.post(f"{url}/wake_up").status_code == 200
        assert [_greedy(url, p) for p in prompts] == before


def test_a_failed_sleep_leaves_the_server_awake(tiny_dev_server: ServerThread,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(tiny_dev_server)

    def held() -> int:
        raise RuntimeError("reset_prefix_cache: requests still hold KV blocks")

    monkeypatch.setattr(engine.scheduler.kv, "reset_prefix_cache", held)
    refused = httpx.post(f"{tiny_dev_server.url}/sleep", params={"level": 2})
    assert refused.status_code == 409 and "still hold KV" in refused.text
    assert httpx.get(f"{tiny_dev_server.url}/is_sleeping").json() == {"is_sleeping": False}
    assert isinstance(engine.executor, TorchExecutor) and engine.executor.sleeping is None
    assert _greedy(tiny_dev_server.url, [5] * 4)


def test_a_pipeline_group_sleeps_and_wakes_as_a_single_executor(
        tiny_dev_server: ServerThread) -> None:
    """A KunServe pipeline group's executor sleeps too (andante.exec.torch_pipeline_sleep):
    its stages' KV is freed, and the woken group answers as before."""
    url = tiny_dev_server.url
    engine = _engine(tiny_dev_server)
    unsplit = engine.executor
    assert isinstance(unsplit, TorchExecutor)
    num_layers = unsplit.model.config.num_layers
    kv = device_kv_bytes(unsplit.kv.num_device_blocks, unsplit.model, unsplit.options)
    pipeline = pipeline_executor(  # what a KunServe merge puts in
        unsplit.model, unsplit.options, [(0, 1), (1, num_layers)], [kv, kv],
        unsplit.cost_model, unsplit.max_model_len, num_host_blocks=1)
    engine.executor = pipeline
    try:
        before = _greedy(url, [5] * 4)
        for level in (1, 2):
            slept = httpx.post(f"{url}/sleep", params={"level": level})
            assert slept.status_code == 200, slept.text
            assert pipeline.sleeping == level
            assert all(s.kv.device.numel() == 0 for s in pipeline.stages)
            assert httpx.post(f"{url}/wake_up").status_code == 200
            assert pipeline.sleeping is None and _greedy(url, [5] * 4) == before
    finally:
        engine.executor = unsplit
        pipeline.close()


class _Unsleepable:
    """An executor that cannot release its memory (no sleep methods)."""

    def __init__(self, inner: TorchExecutor) -> None:
        self.inner = inner
        self.cost_model = inner.cost_model

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return self.inner.num_kv_blocks(block_size)

    def execute(self, batch):  # type: ignore[no-untyped-def]
        return self.inner.execute(batch)


def test_sleep_is_refused_where_the_executor_cannot_release_its_memory(
        tiny_dev_server: ServerThread) -> None:
    """/sleep answers 501 naming an executor that cannot sleep, and the server stays
    awake, instead of claiming a sleep that frees nothing."""
    url = tiny_dev_server.url
    engine = _engine(tiny_dev_server)
    unsplit = engine.executor
    assert isinstance(unsplit, TorchExecutor)
    engine.executor = _Unsleepable(unsplit)  # type: ignore[assignment]
    try:
        refused = httpx.post(f"{url}/sleep", params={"level": 1})
        assert refused.status_code == 501 and "_Unsleepable" in refused.text
        assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
    finally:
        engine.executor = unsplit
    assert _greedy(url, [5] * 4)
