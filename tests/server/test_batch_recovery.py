"""Crash recovery with real processes: a server killed (-9) mid-batch resumes it from
its SQLite state directory; with two servers on one Redis, the survivor takes over the
dead one's pending requests (XAUTOCLAIM). Either way the batch completes with exactly
one result per custom_id."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.runtime.redis_server import redis_server
from tests.server.batch_helpers import (
    ServeProcess,
    batch_lines,
    finished,
    output_lines,
    serve_process,
    submit,
    wait_batch,
)

N = 300
SLOW_SERVER = ("--toy-step-ms", "10", "--batch-max-in-flight", "8")


def _done(batch: dict[str, object]) -> int:
    counts = batch["request_counts"]
    assert isinstance(counts, dict)
    return int(counts["completed"]) + int(counts["failed"])


def _check_exactly_once(url: str, batch: dict[str, object], n: int) -> None:
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": n, "completed": n, "failed": 0}
    lines = output_lines(url, batch["output_file_id"])  # type: ignore[arg-type]
    ids = Counter(line["custom_id"] for line in lines)
    assert len(lines) == n and set(ids) == {f"req-{i}" for i in range(n)}
    assert max(ids.values()) == 1
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert batch["error_file_id"] is None


@pytest.mark.slow
def test_sqlite_server_killed_mid_batch_resumes_it(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    first = ServeProcess("--state-dir", state, *SLOW_SERVER)
    try:
        batch = submit(first.url, batch_lines(N))
        seen = wait_batch(first.url, batch["id"], lambda b: _done(b) >= N // 5)
        assert not finished(seen)
    finally:
        first.kill()
    with serve_process("--state-dir", state, *SLOW_SERVER) as second:
        resumed = wait_batch(second.url, batch["id"], finished, timeout=120)
        _check_exactly_once(second.url, resumed, N)


@pytest.mark.slow
def test_redis_two_controllers_one_killed() -> None:
    import redis

    with redis_server() as queue:
        common = ("--queue", queue, "--queue-claim-idle", "1", *SLOW_SERVER)
        with serve_process(*common, "--queue-consumer", "b") as survivor:
            doomed = ServeProcess(*common, "--queue-consumer", "a")
            try:
                batch = submit(doomed.url, batch_lines(N))
                wait_batch(doomed.url, batch["id"], lambda b: _done(b) >= N // 5)
            finally:
                doomed.kill()
            client = redis.Redis.from_url(queue)
            stream = "andante:queue:toy"
            orphaned = client.xpending_range(stream, "andante", "-", "+", 100, consumername="a")
            resumed = wait_batch(survivor.url, batch["id"], finished, timeout=120)
            _check_exactly_once(survivor.url, resumed, N)
            # what "a" held when it died was claimed (XAUTOCLAIM) and acknowledged by "b"
            assert orphaned, "the killed server held no pending entries"
            assert client.xpending(stream, "andante")["pending"] == 0
