"""Batch work fills idle capacity: it carries the batch's deadline as its SLO and a low
priority, it never starts while an interactive request waits for its first token, and
at most `max_in_flight` batch requests run at once."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any

from andante.core.request import Request
from andante.runtime.durable.store import open_store
from andante.server import ServerThread
from andante.server.batches.execute import BATCH_PRIORITY
from andante.server.batches.service import BatchService, default_max_in_flight
from andante.server.config import BatchOptions, EngineOptions, ServeOptions
from tests.server.batch_helpers import batch_lines, finished, submit, wait_batch
from tests.server.helpers import toy_options


def _fake_state(waiting: int, batch_waiting: int = 0, alive: bool = True) -> Any:
    options = ServeOptions(model="toy", engine=EngineOptions(max_num_seqs=16), instances=2)
    return SimpleNamespace(options=options, runner=SimpleNamespace(is_alive=alive),
                           hub=SimpleNamespace(num_not_started=waiting + batch_waiting))


def test_room_is_zero_while_interactive_requests_wait(tmp_path: Any) -> None:
    store = open_store("sqlite", tmp_path)
    service = BatchService(_fake_state(0), store, BatchOptions())
    assert service.max_in_flight == default_max_in_flight(service.state) == 8  # 16/4 * 2
    assert service.room() == 8
    service.state = _fake_state(1)
    assert service.room() == 0
    service.state = _fake_state(0, alive=False)
    assert service.room() == 0
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
            service = server._app.state.batches
            most[0] = max(most[0], len(service.running))
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
