"""The embedded durable queue: one SQLite file in the server's state directory.

Design note: WAL mode (readers never block the writer) with `synchronous=NORMAL`: a
commit survives the process being killed (`kill -9`), as the WAL is in the OS's page
cache; only a power loss can drop the last commits (FULL would fsync every one). One
process owns the file (the server's state directory is its own): every item left
claimed by a previous process is unclaimed when the store opens, so a restart replays
exactly the work that had no durable outcome. `complete` is one transaction: the
outcome row (primary key (batch_id, custom_id), `INSERT OR IGNORE`), the batch's
counter (only when the row is new) and the deletion of the queue row.

A large upload is stored from its temporary file in chunks of `CHUNK_BYTES`, one short
transaction each, and its `files` row (what makes it visible) last: never the whole
file in memory, never the store's lock held for long. Chunks of a file whose row never
came (a crash mid-upload) are dropped when the store opens.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO

from andante.runtime.durable.errors import StoreFull
from andante.runtime.durable.records import (
    DONE_CANCELLED,
    DONE_FAILED,
    DONE_OK,
    OPEN_STATUSES,
    BatchRecord,
    FileRecord,
    Outcome,
    RequestCounts,
    StatusSummary,
    WorkItem,
)

PENDING, CLAIMED = 0, 1
CHUNK_BYTES = 1 << 20
_COUNTER = {DONE_OK: "completed", DONE_FAILED: "failed", DONE_CANCELLED: "cancelled"}
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, doc TEXT NOT NULL, content BLOB);
CREATE TABLE IF NOT EXISTS file_chunks (
    file_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (file_id, seq));
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, status TEXT NOT NULL,
    doc TEXT NOT NULL, total INTEGER NOT NULL, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, cancelled INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY AUTOINCREMENT, batch_id TEXT NOT NULL, custom_id TEXT NOT NULL,
    line INTEGER NOT NULL, url TEXT NOT NULL, body TEXT NOT NULL, model TEXT NOT NULL,
    expires_at INTEGER NOT NULL, state INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS items_ready ON items (state, model, expires_at, id);
CREATE TABLE IF NOT EXISTS outcomes (
    batch_id TEXT NOT NULL, custom_id TEXT NOT NULL, line INTEGER NOT NULL,
    kind TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (batch_id, custom_id));
"""


class SQLiteStore:
    kind = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._dir_lock = lock_state_dir(self.path.parent)
        self._init_connection()
        self._init_schema()
        self.num_recovered = self._unclaim_all()

    def _init_connection(self) -> None:
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")

    def _init_schema(self) -> None:
        self._db.executescript(SCHEMA)
        with self._tx() as db:  # chunks of an upload cut short
            db.execute("DELETE FROM file_chunks WHERE file_id NOT IN (SELECT id FROM files)")

    def _unclaim_all(self) -> int:
        """Items a previous process claimed and never acknowledged go back to the queue."""
        with self._tx() as db:
            return db.execute("UPDATE items SET state=? WHERE state=?",
                              (PENDING, CLAIMED)).rowcount

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, _full_is_store_full():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        with self._lock, _full_is_store_full():
            return self._db.execute(sql, args).fetchall()

    # ---- files --------------------------------------------------------------------
    def put_file(self, record: FileRecord, content: bytes) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO files (id, doc, content) VALUES (?, ?, ?)",
                       (record.id, json.dumps(record.doc()), content))

    def put_file_from(self, record: FileRecord, source: BinaryIO) -> None:
        left, seq = record.bytes, 0
        while left > 0:
            data = source.read(min(CHUNK_BYTES, left))
            if not data:
                raise ValueError(f"the content of {record.id} ended {left} bytes early")
            with self._tx() as db:
                db.execute("INSERT OR REPLACE INTO file_chunks (file_id, seq, data) "
                           "VALUES (?, ?, ?)", (record.id, seq, data))
            left -= len(data)
            seq += 1
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO files (id, doc, content) VALUES (?, ?, NULL)",
                       (record.id, json.dumps(record.doc())))

    def get_file(self, file_id: str) -> FileRecord | None:
        rows = self._query("SELECT doc FROM files WHERE id=?", (file_id,))
        return FileRecord.from_doc(json.loads(str(rows[0][0]))) if rows else None

    def file_content(self, file_id: str) -> bytes | None:
        rows = self._query("SELECT content FROM files WHERE id=?", (file_id,))
        if not rows:
            return None
        if rows[0][0] is not None:
            return bytes(rows[0][0])  # type: ignore[call-overload]
        chunks = self._query("SELECT data FROM file_chunks WHERE file_id=? ORDER BY seq",
                             (file_id,))
        return b"".join(bytes(row[0]) for row in chunks)  # type: ignore[call-overload]

    def list_files(self, after: str | None, limit: int) -> list[FileRecord]:
        if after is None:
            rows = self._query("SELECT doc FROM files ORDER BY rowid DESC LIMIT ?", (limit,))
        else:
            rows = self._query("SELECT doc FROM files WHERE rowid < (SELECT rowid FROM files "
                               "WHERE id=?) ORDER BY rowid DESC LIMIT ?", (after, limit))
        return [FileRecord.from_doc(json.loads(str(row[0]))) for row in rows]

    def delete_file(self, file_id: str) -> bool:
        with self._tx() as db:
            found = db.execute("DELETE FROM files WHERE id=?", (file_id,)).rowcount
            db.execute("DELETE FROM file_chunks WHERE file_id=?", (file_id,))
        return bool(found)

    def expired_files(self, now: float, limit: int) -> list[str]:
        rows = self._query("SELECT id FROM files WHERE json_extract(doc, '$.expires_at') <= ? "
                           "LIMIT ?", (now, limit))
        return [str(row[0]) for row in rows]

    # ---- batches ------------------------------------------------------------------
    def create_batch(self, batch: BatchRecord, items: Sequence[WorkItem]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO batches (id, status, doc, total) VALUES (?, ?, ?, ?)",
                       (batch.id, batch.status, json.dumps(batch.doc()), batch.counts.total))
            db.executemany(
                "INSERT INTO items (batch_id, custom_id, line, url, body, model, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(i.batch_id, i.custom_id, i.line, i.url, i.body, i.model, batch.expires_at)
                 for i in items])

    def get_batch(self, batch_id: str) -> BatchRecord | None:
        rows = self._query(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id=?", (batch_id,))
        return _batch(rows[0]) if rows else None

    def save_batch(self, batch: BatchRecord) -> None:
        with self._tx() as db:
            db.execute("UPDATE batches SET status=?, doc=? WHERE id=?",
                       (batch.status, json.dumps(batch.doc()), batch.id))

    def list_batches(self, after: str | None, limit: int) -> list[BatchRecord]:
        if after is None:
            rows = self._query(f"SELECT {_BATCH_COLUMNS} FROM batches ORDER BY seq DESC "
                               "LIMIT ?", (limit,))
        else:
            rows = self._query(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE seq < (SELECT seq "
                               "FROM batches WHERE id=?) ORDER BY seq DESC LIMIT ?",
                               (after, limit))
        return [_batch(row) for row in rows]

    def open_batches(self) -> list[BatchRecord]:
        marks = ",".join("?" * len(OPEN_STATUSES))
        rows = self._query(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE status IN ({marks}) "
                           "ORDER BY seq", sorted(OPEN_STATUSES))
        return [_batch(row) for row in rows]

    def summary(self) -> list[StatusSummary]:
        rows = self._query("SELECT status, COUNT(*), SUM(total), SUM(completed), SUM(failed) "
                           "FROM batches GROUP BY status")
        return [StatusSummary(str(s), int(n), int(t), int(c), int(f))  # type: ignore[call-overload]
                for s, n, t, c, f in rows]

    # ---- the queue ----------------------------------------------------------------
    def claim(self, models: Sequence[str], limit: int) -> list[WorkItem]:
        if limit <= 0 or not models:
            return []
        marks = ",".join("?" * len(models))
        with self._tx() as db:
            rows = db.execute(
                f"SELECT id, batch_id, custom_id, line, url, body, model FROM items "
                f"WHERE state=? AND model IN ({marks}) ORDER BY expires_at, id LIMIT ?",
                (PENDING, *models, limit)).fetchall()
            db.executemany("UPDATE items SET state=? WHERE id=?",
                           [(CLAIMED, row[0]) for row in rows])
        return [WorkItem(b, c, line, u, body, m, str(rid))
                for rid, b, c, line, u, body, m in rows]

    def complete(self, item: WorkItem, outcome: Outcome) -> RequestCounts:
        counter = _COUNTER[outcome.kind]
        with self._tx() as db:
            new = db.execute(
                "INSERT OR IGNORE INTO outcomes (batch_id, custom_id, line, kind, text) "
                "VALUES (?, ?, ?, ?, ?)",
                (item.batch_id, item.custom_id, item.line, outcome.kind, outcome.text)).rowcount
            if new:
                db.execute(f"UPDATE batches SET {counter}={counter}+1 WHERE id=?",
                           (item.batch_id,))
            db.execute("DELETE FROM items WHERE id=?", (int(item.ref),))
            row = db.execute("SELECT total, completed, failed, cancelled FROM batches "
                             "WHERE id=?", (item.batch_id,)).fetchone()
        return RequestCounts(*row) if row else RequestCounts()

    def keep_alive(self, items: Sequence[WorkItem]) -> None:
        """Nothing to do: one process owns the file, its claims last until it restarts."""

    def outcomes(self, batch_id: str) -> list[Outcome]:
        rows = self._query("SELECT custom_id, line, kind, text FROM outcomes WHERE batch_id=? "
                           "ORDER BY line", (batch_id,))
        return [Outcome(str(c), int(n), str(k), str(t))  # type: ignore[call-overload]
                for c, n, k, t in rows]

    def num_queued(self) -> int:
        """Items not yet acknowledged (claimed or not)."""
        return int(self._query("SELECT COUNT(*) FROM items")[0][0])  # type: ignore[call-overload]

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._dir_lock.close()  # releases the flock


_BATCH_COLUMNS = "doc, total, completed, failed, cancelled"
LOCK_FILE = "andante.lock"


class StateDirInUse(ValueError):
    """Another process holds the state directory."""


def lock_state_dir(directory: Path) -> IO[str]:
    """An exclusive lock on the directory (its `andante.lock`), held while the returned
    file is open; `StateDirInUse` naming the holder's PID if another process has it."""
    handle = open(directory / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise StateDirInUse(f"the state directory {directory} is in use by process {holder} "
                            "(another andante server or batch run); give each its own "
                            "--state-dir, or share a Redis queue (--queue redis://...)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


@contextmanager
def _full_is_store_full() -> Iterator[None]:
    """SQLite's "database or disk is full" (and a full disk under its journal) as
    `StoreFull`, for the feeder to fail the batch with the reason."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "full" in str(exc):
            raise StoreFull(str(exc)) from exc
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise StoreFull(str(exc)) from exc
        raise


def _batch(row: tuple[object, ...]) -> BatchRecord:
    doc, total, completed, failed, cancelled = row
    counts = RequestCounts(int(total), int(completed), int(failed), int(cancelled))  # type: ignore[call-overload]
    return BatchRecord.from_doc(json.loads(str(doc)), counts)

