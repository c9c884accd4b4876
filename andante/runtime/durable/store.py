"""The durable queue's one interface, and the function that opens an implementation.

Design note (DESIGN.md §4, "accepted batch work lives in a durable queue"): a batch's
requests are enqueued in the same transaction that records the batch, so an accepted
batch is never half-stored. A consumer `claim`s work items (they stay owned until
acknowledged), runs them, and `complete`s each: the outcome is written, keyed by
(batch, custom_id) and never overwritten, and only then is the item acknowledged, in
one atomic step. A crash between claim and complete leaves the item unacknowledged, and
it runs again (SQLite: the next process to open the store; Redis: whichever consumer
claims the dead one's pending entries); a crash after complete cannot produce a second
outcome, so each custom_id has at most one line in the output files.

Implementations: `SQLiteStore` (embedded default: one file in the state directory, WAL
mode) and `RedisStreamsStore` (`redis://HOST:PORT`: one stream per model, one consumer
group shared by every controller, `XAUTOCLAIM` of a dead consumer's entries).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

from andante.runtime.durable.errors import StoreError, StoreFull, StoreUnavailable
from andante.runtime.durable.records import (
    BatchRecord,
    FileRecord,
    Outcome,
    RequestCounts,
    StatusSummary,
    WorkItem,
)

__all__ = ["DurableStore", "StoreError", "StoreFull", "StoreUnavailable", "open_store"]
STATE_DIR_ENV_VAR = "ANDANTE_STATE_DIR"

SQLITE_FILE = "andante-queue.sqlite3"


class DurableStore(Protocol):
    kind: str  # "sqlite" or "redis"

    # ---- files --------------------------------------------------------------------
    def put_file(self, record: FileRecord, content: bytes) -> None: ...
    def put_file_from(self, record: FileRecord, source: BinaryIO) -> None:
        """Store `record.bytes` bytes read from `source` (a large upload's temporary
        file) without holding them all in memory where the store allows."""
    def get_file(self, file_id: str) -> FileRecord | None: ...
    def file_content(self, file_id: str) -> bytes | None: ...
    def list_files(self, after: str | None, limit: int) -> list[FileRecord]:
        """Newest first; `after`: the id to continue after (older ones)."""
    def delete_file(self, file_id: str) -> bool:
        """Delete the file and its content; False if there was none."""
    def expired_files(self, now: float, limit: int) -> list[str]:
        """Ids of up to `limit` files whose `expires_at` has passed."""

    # ---- batches ------------------------------------------------------------------
    def create_batch(self, batch: BatchRecord, items: Sequence[WorkItem]) -> None:
        """Record the batch and enqueue its items, atomically."""
    def get_batch(self, batch_id: str) -> BatchRecord | None: ...
    def save_batch(self, batch: BatchRecord) -> None:
        """Store the batch's status, times, errors and file ids (not its counts)."""
    def list_batches(self, after: str | None, limit: int) -> list[BatchRecord]:
        """Newest first; `after`: the id to continue after (older ones)."""
    def open_batches(self) -> list[BatchRecord]: ...
    def summary(self) -> list[StatusSummary]: ...

    # ---- the queue ----------------------------------------------------------------
    def claim(self, models: Sequence[str], limit: int) -> list[WorkItem]:
        """Up to `limit` unacknowledged items for these models, now owned by this
        consumer (earliest batch deadline first where the store can order)."""
    def complete(self, item: WorkItem, outcome: Outcome) -> RequestCounts:
        """Write the outcome (unless its custom_id has one), then acknowledge the item;
        the batch's counts after it."""
    def keep_alive(self, items: Sequence[WorkItem]) -> None:
        """Tell the store that this consumer still works on these items."""
    def outcomes(self, batch_id: str) -> list[Outcome]:
        """Every outcome of the batch, in input-line order."""
    def close(self) -> None: ...


def default_state_dir() -> Path:
    """$ANDANTE_STATE_DIR, else $XDG_CACHE_HOME/andante/state, else ~/.cache/andante/state."""
    env = os.environ.get(STATE_DIR_ENV_VAR)
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "andante" / "state"


def open_store(queue: str, state_dir: str | Path | None = None, consumer: str = "",
               claim_idle_s: float = 30.0) -> DurableStore:
    """`queue` "sqlite" (a file in `state_dir`) or "redis://HOST:PORT[/DB]"; a
    `ValueError` saying why if it cannot be opened."""
    if queue == "sqlite":
        from andante.runtime.durable.sqlite import SQLiteStore

        directory = Path(state_dir) if state_dir is not None else default_state_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            return SQLiteStore(directory / SQLITE_FILE)
        except (OSError, sqlite3.Error) as exc:
            raise ValueError(f"cannot open the batch queue in {directory}: {exc}") from None
    if queue.startswith(("redis://", "rediss://", "unix://")):
        from andante.runtime.durable.redis_streams import RedisStreamsStore

        return RedisStreamsStore(queue, consumer or default_consumer(), claim_idle_s)
    raise ValueError(f"queue must be 'sqlite' or redis://HOST:PORT, got {queue!r}")


def default_consumer() -> str:
    """This controller's consumer name: host and process id."""
    return f"{os.uname().nodename}-{os.getpid()}"
