"""Both durable stores behind one interface: atomic enqueue, claims, outcomes written
once per custom_id, acknowledgement, recovery of unacknowledged work."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from andante.runtime.durable import open_store
from andante.runtime.durable.records import (
    CANCELLED,
    DONE_FAILED,
    DONE_OK,
    IN_PROGRESS,
    BatchRecord,
    FileRecord,
    Outcome,
    RequestCounts,
    WorkItem,
    window_seconds,
)
from andante.runtime.durable.store import DurableStore
from tests.runtime.redis_server import redis_server


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """A factory: each call opens the same queue again, as a new process would."""
    opened: list[DurableStore] = []
    if request.param == "sqlite":
        def make(consumer: str = "a") -> DurableStore:
            store = open_store("sqlite", tmp_path)
            opened.append(store)
            return store
        yield make
    else:
        with redis_server() as url:
            def make(consumer: str = "a") -> DurableStore:
                store = open_store(url, consumer=consumer, claim_idle_s=0.05)
                opened.append(store)
                return store
            yield make
    for store in opened:
        store.close()


def _batch(batch_id: str, n: int, created: int = 100) -> tuple[BatchRecord, list[WorkItem]]:
    batch = BatchRecord(batch_id, "file-in", "/v1/completions", "24h", created, created + 86400,
                        counts=RequestCounts(total=n))
    batch.enter(IN_PROGRESS, created)
    items = [WorkItem(batch_id, f"r{i}", i + 1, "/v1/completions",
                      json.dumps({"prompt": str(i)}), "toy") for i in range(n)]
    return batch, items


def _ok(item: WorkItem) -> Outcome:
    return Outcome(item.custom_id, item.line, DONE_OK, json.dumps({"custom_id": item.custom_id}))


def test_files_round_trip(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    store.put_file(FileRecord("file-1", "in.jsonl", "batch", 3, 7), b"a\nb")
    assert store.get_file("file-1") == FileRecord("file-1", "in.jsonl", "batch", 3, 7)
    assert store.file_content("file-1") == b"a\nb"
    assert store.get_file("nope") is None and store.file_content("nope") is None


def test_claim_complete_counts_and_outcome_once(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    batch, items = _batch("batch-1", 5)
    store.create_batch(batch, items)
    claimed = store.claim(["toy"], 3)
    assert [i.custom_id for i in claimed] == ["r0", "r1", "r2"]
    assert store.claim(["other-model"], 3) == []
    counts = store.complete(claimed[0], _ok(claimed[0]))
    assert (counts.total, counts.completed, counts.failed) == (5, 1, 0)
    # a replay of the same custom_id (say, after a crash) keeps the first outcome
    again = Outcome("r0", 1, DONE_FAILED, "{}")
    assert store.complete(claimed[0], again).done == 1
    counts = store.complete(claimed[1], Outcome("r1", 2, DONE_FAILED, "{}"))
    assert (counts.completed, counts.failed) == (1, 1)
    assert [(o.custom_id, o.kind) for o in store.outcomes("batch-1")] == [
        ("r0", DONE_OK), ("r1", DONE_FAILED)]
    assert store.get_batch("batch-1").counts == counts


def test_unacknowledged_work_is_replayed_after_a_crash(make_store) -> None:  # type: ignore[no-untyped-def]
    first = make_store("a")
    batch, items = _batch("batch-2", 4)
    first.create_batch(batch, items)
    claimed = first.claim(["toy"], 4)
    first.complete(claimed[0], _ok(claimed[0]))
    # "a" dies holding r1..r3; a new process (sqlite) or another consumer (redis) takes them
    if hasattr(first, "_dir_lock"):
        first._dir_lock.close()  # a dead process holds no lock on its state directory
    second = make_store("b")
    import time
    time.sleep(0.1)  # past the claim idle time of the redis consumer
    replayed = second.claim(["toy"], 10)
    assert sorted(i.custom_id for i in replayed) == ["r1", "r2", "r3"]
    for item in replayed:
        counts = second.complete(item, _ok(item))
    assert counts.done == 4
    assert [o.custom_id for o in second.outcomes("batch-2")] == ["r0", "r1", "r2", "r3"]
    assert second.claim(["toy"], 10) == []


def test_batches_save_list_and_open(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    for i in range(5):
        store.create_batch(*_batch(f"batch-{i}", 1, created=100 + i))
    done = store.get_batch("batch-1")
    done.enter(CANCELLED, 200)
    store.save_batch(done)
    assert store.get_batch("batch-1").status == CANCELLED
    assert store.get_batch("batch-1").times[CANCELLED] == 200
    assert [b.id for b in store.list_batches(None, 2)] == ["batch-4", "batch-3"]
    assert [b.id for b in store.list_batches("batch-3", 10)] == ["batch-2", "batch-1", "batch-0"]
    assert [b.id for b in store.open_batches()] == ["batch-0", "batch-2", "batch-3", "batch-4"]
    summary = {s.status: s for s in store.summary()}
    assert summary[IN_PROGRESS].num_batches == 4 and summary[CANCELLED].total == 1


def test_window_seconds() -> None:
    assert window_seconds("24h") == 86400 and window_seconds("90s") == 90
    for bad in ("24", "0h", "1w", "-1h", ""):
        with pytest.raises(ValueError, match="completion_window"):
            window_seconds(bad)
