"""The feeder: runs the durable queue's batch work on the server's engines.

Design note (DESIGN.md §4; QLM §1-2: batch requests have SLOs of minutes to hours and
fill the capacity interactive requests leave). Interactive first, by one rule: the
feeder claims batch work from the store only while (1) no interactive request is
waiting for its first token and (2) fewer than `max_in_flight` batch requests are in
flight (default: a quarter of `max_num_seqs` per instance, at most half of
`--max-queued`); while interactive requests are in flight, one per instance, unless a
batch is at risk of missing its window at the recent pace (its deadline slack is
negative: then the whole `max_in_flight`); and (3) at most
`max_in_flight / RAMP_TICKS` start per tick of the feeder (`TICK_S`, or sooner when a
batch request finishes), so their prefills come in small groups rather than one long
step (with no open batch at the last sweep, `SWEEP_S` or a `wake`, it claims nothing).
So batch work fills the engines when interactive traffic leaves them idle, trickles
beside it, stops growing the moment an interactive request waits, and speeds
up when a deadline needs it; batch requests also run at low priority with the batch's
deadline as their SLO (`execute.py`), for the policies that order by either.

Each item's outcome is made durable (`DurableStore.complete`) before its entry is
acknowledged; the batch is finalized (output and error files written, status
completed / expired / cancelled) when every item has an outcome. A request whose
engine failed runs again (`MAX_ATTEMPTS` in all, then its line is a 500); one cut short
by the server stopping gets no outcome: a restart replays whatever had none (the
store's claims), and `start` resumes every unfinished batch. Every store call of the
feeder (claims, outcomes, finalizing: reading every outcome, writing the output files;
a cancelled batch's thousands of settlements) runs on its one store thread, in order,
off the event loop.

The store failing is an event, not a crash: while it is unreachable (`StoreUnavailable`:
Redis down) the feeder logs one line when the outage starts and one when it ends, and
waits; a full store (`StoreFull`) fails the batch it was writing for, with the reason
in the batch's `errors`. Expired files are deleted every `EXPIRY_SWEEP_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from andante.runtime.durable.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    DONE_FAILED,
    DONE_OK,
    EXPIRED,
    FAILED,
    FINALIZING,
    BatchRecord,
    FileRecord,
    Outcome,
    WorkItem,
)
from andante.runtime.durable.store import DurableStore, StoreError, StoreFull
from andante.runtime.free_memory import release_free_memory
from andante.server.batches.execute import (
    EngineFailure,
    ItemRunner,
    batch_error_outcome,
    response_outcome,
)
from andante.server.batches.host import BatchHost, ItemRunning
from andante.server.config import BatchOptions
from andante.server.errors import error_body

log = logging.getLogger("andante.server")
T = TypeVar("T")
TICK_S = 0.05  # the feeder's period when nothing wakes it
SWEEP_S = 1.0  # how often open batches are checked (expiry, finalization, cache)
MAX_ATTEMPTS = 3
RAMP_TICKS = 4  # from idle to max_in_flight batch requests in at least this many ticks
RATE_WINDOW_S = 60.0
EXPIRY_SWEEP_S = 60.0
DOWN_TICK_S = 1.0  # the feeder's period while the store is unreachable
MAX_CLAIMS_PER_TICK = 256  # items claimed per tick (a cancelled batch's are settled off it)


@dataclass(slots=True)
class _Running:
    item: WorkItem
    task: asyncio.Task[None] | None = None
    attempts: int = 0


class BatchFeeder:
    def __init__(self, state: BatchHost, store: DurableStore, options: BatchOptions,
                 wall: Callable[[], float] = time.time,
                 runner: Callable[[], ItemRunning] | None = None) -> None:
        self.state = state
        self._new_runner: Callable[[], ItemRunning] = runner or (
            lambda: ItemRunner(state))  # type: ignore[arg-type]
        self.store = store
        self.options = options
        self.wall = wall
        self.max_in_flight = options.max_in_flight or default_max_in_flight(state)
        self.max_starts_per_tick = max(1, self.max_in_flight // RAMP_TICKS)
        self._init_running()

    def _init_running(self) -> None:
        self.runner = self._new_runner()
        self.running: dict[tuple[str, str], _Running] = {}
        self.cache: dict[str, tuple[float, BatchRecord]] = {}  # id -> (read at, record)
        self.finished_at: deque[float] = deque()  # wall times of recent outcomes
        self.open: list[BatchRecord] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_sweep = 0.0
        self._last_keep_alive = 0.0
        self._last_expiry = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()  # finalizing, expiry sweeps
        self._finalizing: set[str] = set()
        self._store_pool = ThreadPoolExecutor(1, thread_name_prefix="andante-batch-store")
        self.store_error: str | None = None  # why the store is unreachable (None: it is not)

    @property
    def models(self) -> list[str]:
        return list(self.state.backend.served)

    def wake(self) -> None:
        """Look at the queue now (new work, a cancel); from any thread."""
        self._last_sweep = 0.0  # the open batches are read again first
        if self._on_loop():
            self._wake.set()
        else:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._wake.set)

    async def _on_store_thread(self, fn: Callable[[], T]) -> T:
        """`fn()` on the feeder's one store thread: its store work runs in order, off the
        event loop, and competes with it for the interpreter lock from one thread only
        (a cancelled batch's 10,000 settlements on several threads starved it)."""
        return await asyncio.get_running_loop().run_in_executor(self._store_pool, fn)

    def _on_loop(self) -> bool:
        try:
            return self._loop is None or asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def forget(self, batch_id: str) -> None:
        """Drop the cached record of the batch (it changed)."""
        self.cache.pop(batch_id, None)

    def start(self) -> None:
        """Resume the store's unfinished batches and start feeding (on the loop)."""
        self._loop = asyncio.get_running_loop()
        self._sweep()
        if self.open:
            log.info("batches: resuming %d unfinished batch(es) from the %s store",
                     len(self.open), self.store.kind)
        self._task = asyncio.get_running_loop().create_task(self._feed(), name="batch-feeder")

    async def stop(self) -> None:
        """Cancel the feeder and the batch requests in flight (they get no outcome: a
        restart replays them)."""
        tasks = [r.task for r in self.running.values() if r.task is not None]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._background:  # worker threads finishing a write: let them
            await asyncio.wait(list(self._background), timeout=30)
        self._store_pool.shutdown(wait=False)

    async def _feed(self) -> None:
        while True:
            try:
                await self._tick()
                self._store_reached()
            except StoreError as exc:
                self._store_failed(exc)
            except Exception:  # a bug must not end the feeder: log, go on
                log.exception("batches: the feeder's step failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       TICK_S if self.store_error is None else DOWN_TICK_S)
            self._wake.clear()

    def _store_failed(self, exc: StoreError) -> None:
        """One log line when an outage starts (not one per tick)."""
        if self.store_error is None:
            log.warning("batches: the %s store failed (%s); batch work waits until it is "
                        "back", self.store.kind, exc)
        self.store_error = str(exc)

    def _store_reached(self) -> None:
        if self.store_error is not None:
            log.warning("batches: the %s store is back; batch work resumes", self.store.kind)
            self.store_error = None

    def _in_background(self, fn: Callable[[], object]) -> None:
        """`fn()` on the store thread, not awaited here (`stop` waits for it)."""
        async def run() -> None:
            try:
                await self._on_store_thread(fn)
            except StoreError as exc:
                self._store_failed(exc)
            except Exception:
                log.exception("batches: a background step failed")

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _tick(self) -> None:
        """One step of the feeder; its store calls run on the store thread (a long write
        by another thread, such as a batch's creation, never holds the event loop)."""
        now = self.wall()
        if now - self._last_sweep >= SWEEP_S:
            await self._on_store_thread(self._sweep)
        if now - self._last_expiry >= EXPIRY_SWEEP_S:
            self._last_expiry = now
            self._in_background(self.delete_expired_files)
        if now - self._last_keep_alive >= self.options.claim_idle_s / 3:
            self._last_keep_alive = now
            items = [r.item for r in self.running.values()]
            await self._on_store_thread(lambda: self.store.keep_alive(items))
        starts, claimed = self.max_starts_per_tick, 0
        to_settle: list[tuple[WorkItem, Outcome]] = []
        # no open batch (as of the last sweep, at most SWEEP_S old): nothing to claim,
        # and no store call each tick (each one competes with the event loop for the
        # interpreter lock, a stall of the requests it serves)
        while self.open and (room := min(self.room(), starts)) > 0 \
                and claimed < MAX_CLAIMS_PER_TICK:
            items = await self._on_store_thread(
                functools.partial(self.store.claim, self.models, room))
            if not items:
                break
            claimed += len(items)
            for item in items:
                batch = await self._batch(item.batch_id)
                starts -= self._dispatch(item, batch, to_settle)
        if to_settle:  # a cancelled batch's thousands of items: not on the event loop
            self._in_background(lambda: self._settle_all(to_settle))

    def _settle_all(self, settled: list[tuple[WorkItem, Outcome]]) -> None:
        for item, outcome in settled:
            self._settle(item, outcome)
        release_free_memory()

    def room(self) -> int:
        """How many more batch requests may start now (the rule in the module note)."""
        if not self.state.runner.is_alive or self.state.sleep_level is not None:
            return 0  # a sleeping server (dev mode) takes no new work
        hub = self.state.hub
        if hub.num_not_started - self.runner.num_not_started > 0:
            return 0  # an interactive request waits for its first token
        cap = self.max_in_flight
        interactive = hub.num_in_flight - len(self.runner.streams)
        if interactive > 0 and not self.at_risk:
            cap = min(cap, self.state.options.instances)  # one beside them per instance
        return cap - len(self.running)

    @property
    def at_risk(self) -> bool:
        """Some unfinished batch will miss its window at the recent pace."""
        return any(self.slack(batch) < 0 for batch in self.open)

    def _dispatch(self, item: WorkItem, batch: BatchRecord | None,
                  to_settle: list[tuple[WorkItem, Outcome]]) -> bool:
        """Run the item, or note its outcome in `to_settle` (cancelled, expired); True if
        it runs."""
        key = (item.batch_id, item.custom_id)
        if key in self.running:  # claimed twice (an idle entry of ours): already running
            return False
        if batch is None or batch.status in (CANCELLING, CANCELLED) or not batch.is_open:
            to_settle.append((item, batch_error_outcome(item, "batch_cancelled",
                                                        "the batch was cancelled")))
        elif self.wall() >= batch.expires_at:
            to_settle.append((item, batch_error_outcome(
                item, "batch_expired", "the request could not run before the batch's "
                "completion window expired")))
        else:
            running = _Running(item)
            self.running[key] = running
            running.task = asyncio.get_running_loop().create_task(self._run(running, batch))
            return True
        return False

    async def _run(self, running: _Running, batch: BatchRecord) -> None:
        self._loop = self._loop or asyncio.get_running_loop()  # settling calls back to it
        item = running.item
        try:
            while True:
                running.attempts += 1
                try:
                    outcome = await self.runner.run(item, batch.expires_at - self.wall())
                    break
                except EngineFailure as exc:
                    if not self.state.runner.is_alive:
                        return  # no outcome: the server is going down, a restart replays it
                    if running.attempts >= MAX_ATTEMPTS:
                        log.warning("batches: %s, %d times; it fails", exc, running.attempts)
                        outcome = response_outcome(item, 500, None, error_body(
                            500, f"the engine failed {running.attempts} times while serving "
                            "this request", None, "engine_error"))
                        break
                    log.info("batches: %s; running it again", exc)
            await self._on_store_thread(functools.partial(self._settle, item, outcome))
        finally:
            self.running.pop((item.batch_id, item.custom_id), None)
            self._wake.set()

    def _settle(self, item: WorkItem, outcome: Outcome) -> None:
        try:
            counts = self.store.complete(item, outcome)
        except StoreFull as exc:
            self._fail_batch(item.batch_id, f"the batch store is full ({exc}): results "
                             "cannot be recorded")
            return
        except StoreError as exc:  # no outcome: the item runs again once the store is back
            self._store_failed(exc)
            return
        if outcome.kind in (DONE_OK, DONE_FAILED):
            self.finished_at.append(self.wall())
        if counts.remaining <= 0:
            self.finalize_soon(item.batch_id)

    def finalize_soon(self, batch_id: str) -> None:
        """Finalize the batch on a worker thread (once at a time per batch); from any
        thread."""
        if not self._on_loop():
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self.finalize_soon, batch_id)
            return
        if batch_id in self._finalizing:
            return
        self._finalizing.add(batch_id)

        def work() -> None:
            try:
                self.finalize(batch_id)
            finally:
                self._finalizing.discard(batch_id)

        self._in_background(work)

    def _fail_batch(self, batch_id: str, reason: str) -> None:
        """Close the batch as failed, the reason in its errors (a full store)."""
        log.warning("batches: %s fails: %s", batch_id, reason)
        batch = self.store.get_batch(batch_id)
        if batch is None or not batch.is_open:
            return
        batch.errors = [{"code": "store_full", "message": reason, "param": None,
                         "line": None}]
        batch.enter(FAILED, self.wall())
        try:
            self.store.save_batch(batch)
        except StoreError as exc:
            self._store_failed(exc)
        self.cache.pop(batch_id, None)

    def delete_expired_files(self) -> None:
        """Delete the files whose `expires_at` has passed (on a worker thread)."""
        for file_id in self.store.expired_files(self.wall(), 1000):
            self.store.delete_file(file_id)

    async def _batch(self, batch_id: str) -> BatchRecord | None:
        """The batch, re-read at most every `SWEEP_S` (another controller may cancel it)."""
        now = self.wall()
        cached = self.cache.get(batch_id)
        if cached is None or now - cached[0] > SWEEP_S:
            batch = await self._on_store_thread(
                functools.partial(self.store.get_batch, batch_id))
            if batch is None:
                return None
            self.cache[batch_id] = cached = (now, batch)
        return cached[1]

    def _sweep(self) -> None:
        """Finalize the open batches whose items all have outcomes; forget old cache."""
        self._last_sweep = now = self.wall()
        self.cache = {k: v for k, v in self.cache.items() if now - v[0] <= SWEEP_S}
        self.open = self.store.open_batches()
        for batch in self.open:
            if batch.counts.remaining <= 0 or batch.status == FINALIZING:
                self.finalize_soon(batch.id)

    def finalize(self, batch_id: str) -> None:
        """Write the output and error files and close the batch (idempotent; a full
        store fails it with the reason)."""
        try:
            self._finalize(batch_id)
            release_free_memory()  # the batch's outcomes and output files
        except StoreFull as exc:
            self._fail_batch(batch_id, f"the batch store is full ({exc}): the output files "
                             "cannot be written")

    def _finalize(self, batch_id: str) -> None:
        batch = self.store.get_batch(batch_id)
        if batch is None or not batch.is_open:
            return
        now = self.wall()
        cancelling = CANCELLING in batch.times  # also after a crash while finalizing
        batch.enter(FINALIZING, now)
        self.store.save_batch(batch)
        outcomes = self.store.outcomes(batch_id)
        batch.output_file_id = self._write_file(batch, "output", outcomes, DONE_OK)
        batch.error_file_id = self._write_file(batch, "errors", outcomes, DONE_FAILED)
        expired = any(_error_code(o) == "batch_expired" for o in outcomes
                      if o.kind == DONE_FAILED)
        batch.enter(CANCELLED if cancelling else EXPIRED if expired else COMPLETED, now)
        self.store.save_batch(batch)
        self.cache.pop(batch_id, None)
        log.info("batches: %s %s (%d completed, %d failed of %d)", batch_id, batch.status,
                 batch.counts.completed, batch.counts.failed, batch.counts.total)

    def _write_file(self, batch: BatchRecord, name: str, outcomes: list[Outcome],
                    kind: str) -> str | None:
        lines = [o.text for o in outcomes if o.kind == kind]
        if not lines:
            return None
        content = ("\n".join(lines) + "\n").encode("utf-8")
        file_id = f"file-{batch.id.removeprefix('batch_')}-{name}"
        now = int(self.wall())
        keep = self.options.file_retention_s
        self.store.put_file(FileRecord(file_id, f"{batch.id}_{name}.jsonl", "batch_output",
                                       len(content), now,
                                       None if keep is None else now + int(keep),
                                       batch.owner), content)
        return file_id

    # ---- figures ------------------------------------------------------------------
    def throughput(self) -> float:
        """Batch requests finished per second over the last minute (this controller)."""
        now = self.wall()
        while self.finished_at and now - self.finished_at[0] > RATE_WINDOW_S:
            self.finished_at.popleft()
        return len(self.finished_at) / RATE_WINDOW_S

    def slack(self, batch: BatchRecord) -> float:
        """Seconds to spare at the current pace: time left minus the time the remaining
        requests need (time left if nothing has finished yet)."""
        left = batch.expires_at - self.wall()
        rate = self.throughput()
        return left - batch.counts.remaining / rate if rate > 0 else left


def default_max_in_flight(state: BatchHost) -> int:
    options = state.options
    per_instance = max(1, options.engine.max_num_seqs // 4)
    return max(1, min(per_instance * options.instances, options.max_queued // 2))


def _error_code(outcome: Outcome) -> str | None:
    error = json.loads(outcome.text).get("error")
    return error.get("code") if isinstance(error, dict) else None
