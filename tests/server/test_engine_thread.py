"""The engine thread: one hand-off per step, no busy spin when idle, stop strings."""

from __future__ import annotations

import asyncio
import time

from andante.core import Request, SamplingParams
from andante.core.clock import MonotonicClock
from andante.llm import build_engine
from andante.policies import SchedulerConfig
from andante.server.outputs import Delta, OutputProcessor
from andante.server.runner import EngineRunner
from andante.server.toy import TOY_TEXT, ByteTokenizer, ToyExecutor


def _runner(step_time: float = 0.001) -> EngineRunner:
    outputs = OutputProcessor()
    engine = build_engine(ToyExecutor(step_time=step_time), MonotonicClock(), "vllm",
                          SchedulerConfig(max_model_len=512, max_num_batched_tokens=512))
    return EngineRunner(engine, outputs)


def _request(rid: str, max_tokens: int, stop: tuple[str, ...] = ()) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens, stop=stop), 0.0)


def test_one_hand_off_per_step_carries_every_request() -> None:
    async def main() -> tuple[list[list[Delta]], int]:
        runner = _runner()
        calls: list[list[Delta]] = []
        done = asyncio.Event()

        def deliver(deltas: list[Delta]) -> None:
            calls.append(deltas)
            if sum(d.finish_reason is not None for c in calls for d in c) == 5:
                done.set()

        runner.start(asyncio.get_running_loop(), deliver, lambda exc: None)
        tokenizer = ByteTokenizer()
        for i in range(5):
            runner.submit(_request(f"r{i}", 8), tokenizer.incremental_decoder(), ())
        await asyncio.wait_for(done.wait(), 10)
        runner.stop()
        return calls, runner.snapshot.num_steps

    calls, num_steps = asyncio.run(main())
    assert len(calls) <= num_steps
    assert max(len(c) for c in calls) == 5  # the five requests step together
    texts: dict[str, str] = {}
    for call in calls:
        assert len({d.request_id for d in call}) == len(call)
        for d in call:
            texts[d.request_id] = texts.get(d.request_id, "") + d.text
    assert texts == {f"r{i}": TOY_TEXT[:8] for i in range(5)}


def test_idle_engine_thread_sleeps() -> None:
    async def main() -> None:
        runner = _runner()
        runner.start(asyncio.get_running_loop(), lambda d: None, lambda exc: None)
        await asyncio.sleep(0.05)
        steps = runner.engine.num_steps
        cpu = time.thread_time()
        await asyncio.sleep(0.3)
        assert runner.engine.num_steps == steps == 0
        assert runner.is_alive
        runner.stop()
        assert not runner.is_alive
        assert time.thread_time() - cpu < 0.1

    asyncio.run(main())


def test_stop_string_truncates_and_holds_back() -> None:
    async def main() -> list[Delta]:
        runner = _runner()
        got: list[Delta] = []
        done = asyncio.Event()

        def deliver(deltas: list[Delta]) -> None:
            got.extend(deltas)
            if any(d.finish_reason for d in deltas):
                done.set()

        runner.start(asyncio.get_running_loop(), deliver, lambda exc: None)
        runner.submit(_request("s", 100, ("brown", "lazy")), ByteTokenizer().incremental_decoder(),
                      ("brown", "lazy"))
        await asyncio.wait_for(done.wait(), 10)
        runner.stop()
        return got

    got = asyncio.run(main())
    assert "".join(d.text for d in got) == "The quick "
    assert got[-1].finish_reason == "stop"
    assert got[-1].record is not None and got[-1].record.num_output_tokens == len("The quick brown")
    assert got[-1].num_output_tokens == len("The quick brown")


def test_byte_decoder_waits_for_whole_characters() -> None:
    tokenizer = ByteTokenizer()
    decoder = tokenizer.incremental_decoder()
    pieces = [decoder.push(b) for b in "é€".encode()]
    assert pieces == ["", "é", "", "", "€"]
    assert tokenizer.decode(tokenizer.encode("héllo")) == "héllo"


def test_engine_failure_ends_every_stream() -> None:
    class Broken(ToyExecutor):
        def execute(self, batch):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    async def main() -> None:
        outputs = OutputProcessor()
        engine = build_engine(Broken(), MonotonicClock(), "vllm",
                              SchedulerConfig(max_model_len=512, max_num_batched_tokens=512))
        runner = EngineRunner(engine, outputs)
        failed = asyncio.Event()
        runner.start(asyncio.get_running_loop(), lambda d: None, lambda exc: failed.set())
        runner.submit(_request("x", 4), ByteTokenizer().incremental_decoder(), ())
        await asyncio.wait_for(failed.wait(), 5)
        assert not runner.is_alive and isinstance(runner.error, RuntimeError)

    asyncio.run(main())
