"""The fleet's durable queue: Redis Streams shared by several controllers.

Design note (DESIGN.md §4): one stream per model (`andante:queue:<model>`) carries the
work items; every controller is a consumer of the one consumer group `andante` on each
stream (a group per controller would hand every item to every controller), so an item
is delivered to one controller at a time and stays in that consumer's pending entries
list until acknowledged. A controller that dies leaves its entries pending; another
claims them with `XAUTOCLAIM` once they have been idle for `claim_idle_s`. A live
controller keeps its own entries fresh (`keep_alive`: `XCLAIM` to itself, which resets
their idle time) so a long request is not stolen; if one is stolen anyway, both runs
race to the outcome, and only the first is kept. A controller restarted under the same
consumer name first re-reads its own pending entries.

`complete` is one Lua script, atomic on the server: `HSETNX` of the outcome in the
batch's outcome hash (keyed by custom_id: written once), the batch's counter when the
outcome is new, and only then `XACK` (and `XDEL`) of the entry. Batches and files are
hashes; `andante:batches` (a sorted set by creation order) lists them and
`andante:open` holds the unfinished ones.

Redis failing is the store failing, not a bug (`guarded`): a connection error or
timeout is `StoreUnavailable` (routes answer 503, the feeder waits and logs the outage
once), an out-of-memory refusal `StoreFull`. A Redis that lost its data (restarted
without persistence, `FLUSHALL`) has lost the consumer group too: `NOGROUP` forgets
the group, which the retry then recreates. What survives a Redis restart is what
Redis persisted: the exactly-once guarantee needs `appendonly yes` (AOF; `appendfsync
everysec` loses at most the last second on a power loss, `always` nothing).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, TypeVar, cast

from andante.runtime.durable.errors import StoreFull, StoreUnavailable
from andante.runtime.durable.records import (
    DONE_CANCELLED,
    DONE_FAILED,
    DONE_OK,
    BatchRecord,
    FileRecord,
    Outcome,
    RequestCounts,
    StatusSummary,
    WorkItem,
)

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
PREFIX = "andante:"
GROUP = "andante"
_COUNTER = {DONE_OK: "completed", DONE_FAILED: "failed", DONE_CANCELLED: "cancelled"}
_COUNT_FIELDS = ("total", "completed", "failed", "cancelled")
COMPLETE_SCRIPT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
end
redis.call('XACK', KEYS[3], ARGV[4], ARGV[5])
redis.call('XDEL', KEYS[3], ARGV[5])
return redis.call('HMGET', KEYS[2], 'total', 'completed', 'failed', 'cancelled')
"""


def stream_key(model: str) -> str:
    return f"{PREFIX}queue:{model}"


def _batch_key(batch_id: str) -> str:
    return f"{PREFIX}batch:{batch_id}"


def _outcome_key(batch_id: str) -> str:
    return f"{PREFIX}out:{batch_id}"


def guarded(method: F) -> F:
    """Redis' failures as the store's (module note); `NOGROUP` forgets the cached
    groups and retries once (their streams are recreated with them)."""

    @functools.wraps(method)
    def call(self: RedisStreamsStore, *args: Any, **kwargs: Any) -> Any:
        import redis

        for attempt in (1, 2):
            try:
                return method(self, *args, **kwargs)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise StoreUnavailable(f"Redis: {exc}") from exc
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc) and attempt == 1:
                    self._groups.clear()  # Redis lost its data: recreate them
                    continue
                if str(exc).startswith("OOM"):
                    raise StoreFull(f"Redis: {exc}") from exc
                raise
        raise AssertionError("unreachable")

    return cast(F, call)


def guard_public_methods(cls: type[T]) -> type[T]:
    """Class decorator: `guarded` on every public method but `close`."""
    for name, value in list(vars(cls).items()):
        if callable(value) and not name.startswith("_") and name != "close":
            setattr(cls, name, guarded(value))
    return cls


@guard_public_methods
class RedisStreamsStore:
    kind = "redis"

    def __init__(self, url: str, consumer: str, claim_idle_s: float = 30.0) -> None:
        if not claim_idle_s > 0:
            raise ValueError(f"claim_idle_s must be > 0, got {claim_idle_s}")
        self.consumer = consumer
        self.claim_idle_ms = int(claim_idle_s * 1000)
        self._init_client(url)
        self._groups: set[str] = set()
        self._own_cursor: dict[str, str] = {}  # stream -> where re-reading our PEL stands
        self.num_claimed_from_others = 0

    def _init_client(self, url: str) -> None:
        try:
            import redis  # the fleet's extra
        except ImportError:
            raise ValueError("a Redis queue needs the redis package: pip install -e "
                             "'.[redis]'") from None

        # timeouts: a Redis that hangs must not hang the server's event loop for long
        self._redis: Any = redis.Redis.from_url(url, socket_connect_timeout=2.0,
                                                socket_timeout=5.0)
        try:
            self._redis.ping()  # fail at start, with the URL in the message
        except redis.RedisError as exc:
            raise ValueError(f"cannot reach the Redis queue at {url}: {exc}") from None
        self._complete = self._redis.register_script(COMPLETE_SCRIPT)

    def _ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        import redis

        try:
            self._redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(stream)
        self._own_cursor.setdefault(stream, "0")

    # ---- files --------------------------------------------------------------------
    def put_file(self, record: FileRecord, content: bytes) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(f"{PREFIX}file:{record.id}",
                  mapping={"doc": json.dumps(record.doc()), "content": content})
        pipe.zadd(f"{PREFIX}files", {record.id: self._redis.incr(f"{PREFIX}file-seq")})
        if record.expires_at is not None:
            pipe.zadd(f"{PREFIX}file-expiry", {record.id: record.expires_at})
        pipe.execute()

    def put_file_from(self, record: FileRecord, source: BinaryIO) -> None:
        # Redis holds the content in memory anyway: read it, store it in one command
        self.put_file(record, source.read(record.bytes))

    def get_file(self, file_id: str) -> FileRecord | None:
        doc = self._redis.hget(f"{PREFIX}file:{file_id}", "doc")
        return None if doc is None else FileRecord.from_doc(json.loads(doc))

    def list_files(self, after: str | None, limit: int) -> list[FileRecord]:
        start = 0
        if after is not None:
            rank = self._redis.zrevrank(f"{PREFIX}files", after)
            if rank is None:
                return []
            start = int(rank) + 1
        ids = self._redis.zrevrange(f"{PREFIX}files", start, start + limit - 1)
        pipe = self._redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hget(f"{PREFIX}file:{_text(file_id)}", "doc")
        return [FileRecord.from_doc(json.loads(doc)) for doc in pipe.execute() if doc]

    def delete_file(self, file_id: str) -> bool:
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(f"{PREFIX}file:{file_id}")
        pipe.zrem(f"{PREFIX}files", file_id)
        pipe.zrem(f"{PREFIX}file-expiry", file_id)
        return bool(pipe.execute()[0])

    def expired_files(self, now: float, limit: int) -> list[str]:
        ids = self._redis.zrangebyscore(f"{PREFIX}file-expiry", "-inf", now, start=0,
                                        num=limit)
        return [_text(file_id) for file_id in ids]

    def file_content(self, file_id: str) -> bytes | None:
        content = self._redis.hget(f"{PREFIX}file:{file_id}", "content")
        return None if content is None else bytes(content)

    # ---- batches ------------------------------------------------------------------
    def create_batch(self, batch: BatchRecord, items: Sequence[WorkItem]) -> None:
        for model in {item.model for item in items}:
            self._ensure_group(stream_key(model))
        seq = self._redis.incr(f"{PREFIX}batch-seq")
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(_batch_key(batch.id), mapping={
            "doc": json.dumps(batch.doc()), "status": batch.status,
            "total": batch.counts.total, "completed": 0, "failed": 0, "cancelled": 0})
        pipe.zadd(f"{PREFIX}batches", {batch.id: seq})
        pipe.sadd(f"{PREFIX}open", batch.id)
        for item in items:
            pipe.xadd(stream_key(item.model), _entry(item))
        pipe.execute()

    def get_batch(self, batch_id: str) -> BatchRecord | None:
        values = self._redis.hmget(_batch_key(batch_id), "doc", *_COUNT_FIELDS)
        return _batch(values)

    def save_batch(self, batch: BatchRecord) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(_batch_key(batch.id), mapping={"doc": json.dumps(batch.doc()),
                                                 "status": batch.status})
        if batch.is_open:
            pipe.sadd(f"{PREFIX}open", batch.id)
        else:
            pipe.srem(f"{PREFIX}open", batch.id)
        pipe.execute()

    def _batches(self, ids: Sequence[Any]) -> list[BatchRecord]:
        pipe = self._redis.pipeline(transaction=False)
        for batch_id in ids:
            key = batch_id.decode() if isinstance(batch_id, bytes) else batch_id
            pipe.hmget(_batch_key(key), "doc", *_COUNT_FIELDS)
        found = [_batch(values) for values in pipe.execute()]
        return [b for b in found if b is not None]

    def list_batches(self, after: str | None, limit: int) -> list[BatchRecord]:
        start = 0
        if after is not None:
            rank = self._redis.zrevrank(f"{PREFIX}batches", after)
            if rank is None:
                return []
            start = int(rank) + 1
        ids = self._redis.zrevrange(f"{PREFIX}batches", start, start + limit - 1)
        return self._batches(ids)

    def open_batches(self) -> list[BatchRecord]:
        found = self._batches(list(self._redis.smembers(f"{PREFIX}open")))
        return sorted(found, key=lambda b: b.created_at)

    def summary(self) -> list[StatusSummary]:
        totals: dict[str, list[int]] = {}
        for batch in self._batches(self._redis.zrange(f"{PREFIX}batches", 0, -1)):
            row = totals.setdefault(batch.status, [0, 0, 0, 0])
            c = batch.counts
            for i, value in enumerate((1, c.total, c.completed, c.failed)):
                row[i] += value
        return [StatusSummary(status, *row) for status, row in totals.items()]

    # ---- the queue ----------------------------------------------------------------
    def claim(self, models: Sequence[str], limit: int) -> list[WorkItem]:
        items: list[WorkItem] = []
        for model in models:
            stream = stream_key(model)
            self._ensure_group(stream)
            for step in (self._reread_own, self._claim_idle, self._read_new):
                if len(items) >= limit:
                    return items
                items += step(stream, limit - len(items))
        return items

    def _reread_own(self, stream: str, limit: int) -> list[WorkItem]:
        """Entries this consumer name was given before a restart (once, at start)."""
        cursor = self._own_cursor.get(stream)
        if cursor is None:
            return []
        reply = self._redis.xreadgroup(GROUP, self.consumer, {stream: cursor}, count=limit)
        entries = reply[0][1] if reply else []
        if not entries:
            self._own_cursor.pop(stream)
            return []
        self._own_cursor[stream] = _text(entries[-1][0])
        return self._items(stream, entries)

    def _claim_idle(self, stream: str, limit: int) -> list[WorkItem]:
        """A dead consumer's entries, idle for `claim_idle_ms` (XAUTOCLAIM)."""
        reply = self._redis.xautoclaim(stream, GROUP, self.consumer, self.claim_idle_ms,
                                       "0-0", count=limit)
        entries = reply[1]
        self.num_claimed_from_others += len(entries)
        return self._items(stream, entries)

    def _read_new(self, stream: str, limit: int) -> list[WorkItem]:
        reply = self._redis.xreadgroup(GROUP, self.consumer, {stream: ">"}, count=limit)
        return self._items(stream, reply[0][1] if reply else [])

    def _items(self, stream: str, entries: Sequence[Any]) -> list[WorkItem]:
        items: list[WorkItem] = []
        for entry_id, fields in entries:
            if not fields:  # deleted while pending: nothing to run, just acknowledge
                self._redis.xack(stream, GROUP, entry_id)
                continue
            items.append(_item(_text(entry_id), fields))
        return items

    def complete(self, item: WorkItem, outcome: Outcome) -> RequestCounts:
        doc = json.dumps([outcome.line, outcome.kind, outcome.text])
        values = self._complete(
            keys=[_outcome_key(item.batch_id), _batch_key(item.batch_id), stream_key(item.model)],
            args=[item.custom_id, doc, _COUNTER[outcome.kind], GROUP, item.ref])
        return RequestCounts(*(int(v or 0) for v in values))

    def keep_alive(self, items: Sequence[WorkItem]) -> None:
        by_stream: dict[str, list[str]] = {}
        for item in items:
            by_stream.setdefault(stream_key(item.model), []).append(item.ref)
        for stream, refs in by_stream.items():
            self._redis.xclaim(stream, GROUP, self.consumer, 0, refs, justid=True)

    def outcomes(self, batch_id: str) -> list[Outcome]:
        found = self._redis.hgetall(_outcome_key(batch_id))
        out = [Outcome(_text(cid), *json.loads(doc)) for cid, doc in found.items()]
        return sorted(out, key=lambda o: o.line)

    def close(self) -> None:
        self._redis.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(item: WorkItem) -> dict[str, str | int]:
    return {"b": item.batch_id, "c": item.custom_id, "l": item.line, "u": item.url,
            "j": item.body, "m": item.model}


def _item(ref: str, fields: dict[Any, Any]) -> WorkItem:
    f = {_text(k): _text(v) for k, v in fields.items()}
    return WorkItem(f["b"], f["c"], int(f["l"]), f["u"], f["j"], f["m"], ref)


def _batch(values: Sequence[Any]) -> BatchRecord | None:
    doc, *counts = values
    if doc is None:
        return None
    return BatchRecord.from_doc(json.loads(doc), RequestCounts(*(int(c or 0) for c in counts)))


