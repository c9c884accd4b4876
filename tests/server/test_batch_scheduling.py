"""Batch work fills idle capacity: it carries the batch's deadline as its SLO and a low
priority, it never starts while an interactive request waits for its first token, and
at most `max_in_flight` batch requests run at once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from types import SimpleNamespace
from typing import Any

from andante.core.request import Request
from andante.runtime.durable.records import IN_PROGRESS, BatchRecord, RequestCounts, WorkItem
from andante.runtime.durable.store import open_store
from andante.server import ServerThread
from andante.server.batches.execute import BATCH_PRIORITY, EngineFailure
from andante.server.batches.feeder import (
    MAX_ATTEMPTS,
    BatchFeeder,
    _Running,
    default_max_in_flight,
)
from andante.server.config import BatchOptions, EngineOptions, ServeOptions
from tests.server.batch_helpers import batch_lines, finished, submit, wait_batch
from tests.server.helpers import toy_options


def _fake_state(waiting: int, running: int = 0, alive: bool = True,
                sleep_level: int | None = None) -> Any:
    """Interactive requests: `waiting` for their first token, `running` past it."""
    options = ServeOptions(model="toy", engine=EngineOptions(max_num_seqs=16), instances=2)
    return SimpleNamespace(options=options, runner=SimpleNamespace(is_alive=alive),
                           hub=SimpleNamespace(num_not_started=waiting,
                                               num_in_flight=waiting + running),
                           sleep_level=sleep_level)


def test_room_follows_the_interactive_load(tmp_path: Any) -> None:
    store = open_store("sqlite", tmp_path)
    feeder = BatchFeeder(_fake_state(0), store, BatchOptions(), wall=lambda: 1000.0)
    assert feeder.max_in_flight == default_max_in_flight(feeder.state) == 8  # 16/4 * 2
    assert feeder.room() == 8  # idle: the whole share
    feeder.state = _fake_state(0, running=3)
    assert feeder.room() == 2  # beside interactive requests: one per instance
    feeder.state = _fake_state(1, running=3)
    assert feeder.room() == 0  # one waits for its first token: nothing starts
    feeder.state = _fake_state(0, alive=False)
    assert feeder.room() == 0
    feeder.state = _fake_state(0, sleep_level=1)
    assert feeder.room() == 0  # asleep (dev mode): no batch work
    late = BatchRecord("batch_late", "f", "/v1/completions", "1m", 900, 1010,
                       counts=RequestCounts(total=100))
    feeder.open = [late]
    feeder.finished_at.extend([999.0] * 60)  # 1 request/s: 100 left need 100 s > 10 s left
    assert feeder.at_risk
    feeder.state = _fake_state(0, running=3)
    assert feeder.room() == 8  # a deadline at risk: the whole share again
    store.close()


def test_batch_requests_carry_the_deadline_and_a_low_priority() -> None:
    options = dataclasses.replace(toy_options(), batch=BatchOptions(max_in_flight=2))
    with ServerThread(options) as server:
        runner = server.state.runner
        seen: list[Request] = []
        most = [0]
        original = runner.submit

        def spy(req: Request) -> None:
            seen.append(req)
            feeder = server._app.state.batches.feeder
            most[0] = max(most[0], len(feeder.running))
            original(req)

        runner.submit = spy  # type: ignore[method-assign]
        before = time.time()
        batch = submit(server.url, batch_lines(10), window="2h")
        done = wait_batch(server.url, batch["id"], finished)
    assert done["status"] == "completed" and len(seen) == 10
    assert all(r.priority >= BATCH_PRIORITY for r in seen)
    for req in seen:
        assert req.slo.deadline is not None
        assert 7200 - (time.time() - before) - 2 <= req.slo.deadline <= 7200
    assert most[0] <= 2


class _FailingRunner:
    def __init__(self) -> None:
        self.calls = 0
        self.num_not_started = 0

    async def run(self, item: Any, seconds_left: float) -> Any:
        self.calls += 1
        raise EngineFailure("the engine failed")


def test_an_engine_failure_is_retried_then_fails_the_line(tmp_path: Any) -> None:
    store = open_store("sqlite", tmp_path)
    service = BatchFeeder(_fake_state(0), store, BatchOptions())
    batch = BatchRecord("batch_x", "file", "/v1/completions", "1h", 0, int(time.time()) + 3600,
                        counts=RequestCounts(total=1))
    batch.enter(IN_PROGRESS, 0)
    store.create_batch(batch, [WorkItem("batch_x", "a", 1, "/v1/completions", "{}", "toy")])
    item = store.claim(["toy"], 1)[0]
    service.runner = _FailingRunner()  # type: ignore[assignment]
    service.running[("batch_x", "a")] = running = _Running(item)

    async def run_then_finalize() -> None:
        await service._run(running, batch)
        await service.stop()  # waits for the finalizing, done on a worker thread

    asyncio.run(run_then_finalize())
    assert service.runner.calls == MAX_ATTEMPTS and not service.running
    [outcome] = store.outcomes("batch_x")
    assert json.loads(outcome.text)["response"]["status_code"] == 500
    assert store.get_batch("batch_x").status == "completed"  # finalized: one failed line
    store.close()
