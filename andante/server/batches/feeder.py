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
step. So batch work fills the engines when interactive traffic leaves them idle,
trickles beside it, stops growing the moment an interactive request waits, and speeds
up when a deadline needs it; batch requests also run at low priority with the batch's
deadline as their SLO (`execute.py`), for the policies that order by either.

Each item's outcome is made durable (`DurableStore.complete`) before its entry is
acknowledged; the batch is finalized (output and error files written, status
completed / expired / cancelled) when every item has an outcome. A request whose
engine failed runs again (`MAX_ATTEMPTS` in all, then its line is a 500); one cut short
by the server stopping gets no outcome: a restart replays whatever had none (the
store's claims), and `start` resumes every unfinished batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from andante.runtime.durable.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    DONE_FAILED,
    DONE_OK,
    EXPIRED,
    FINALIZING,
    BatchRecord,
    FileRecord,
    Outcome,
    WorkItem,
)
from andante.runtime.durable.store import DurableStore
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
TICK_S = 0.05  # the feeder's period when nothing wakes it
SWEEP_S = 1.0  # how often open batches are checked (expiry, finalization, cache)
MAX_ATTEMPTS = 3
RAMP_TICKS = 4  # from idle to max_in_flight batch requests in at least this many ticks
RATE_WINDOW_S = 60.0


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

    @property
    def models(self) -> list[str]:
        return list(self.state.backend.served)

    def wake(self) -> None:
        """Look at the queue now (new work, a cancel)."""
        self._wake.set()

    def forget(self, batch_id: str) -> None:
        """Drop the cached record of the batch (it changed)."""
        self.cache.pop(batch_id, None)

    def start(self) -> None:
        """Resume the store's unfinished batches and start feeding (on the loop)."""
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

    async def _feed(self) -> None:
        while True:
            try:
                self._tick()
            except Exception:  # a store hiccup must not end the feeder: log, go on
                log.exception("batches: the feeder's step failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            self._wake.clear()

    def _tick(self) -> None:
        now = self.wall()
        if now - self._last_sweep >= SWEEP_S:
            self._sweep()
        if now - self._last_keep_alive >= self.options.claim_idle_s / 3:
            self._last_keep_alive = now
            self.store.keep_alive([r.item for r in self.running.values()])
        starts = self.max_starts_per_tick
        while (room := min(self.room(), starts)) > 0:
            items = self.store.claim(self.models, room)
            if not items:
                return
            for item in items:
                starts -= self._dispatch(item)

    def room(self) -> int:
        """How many more batch requests may start now (the rule in the module note)."""
        if not self.state.runner.is_alive:
            return 0
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

    def _dispatch(self, item: WorkItem) -> bool:
        """Run the item, or settle it at once (cancelled, expired); True if it runs."""
        key = (item.batch_id, item.custom_id)
        if key in self.running:  # claimed twice (an idle entry of ours): already running
            return False
        batch = self._batch(item.batch_id)
        if batch is None or batch.status in (CANCELLING, CANCELLED):
            self._settle(item, batch_error_outcome(item, "batch_cancelled",
                                                   "the batch was cancelled"))
        elif self.wall() >= batch.expires_at:
            self._settle(item, batch_error_outcome(
                item, "batch_expired", "the request could not run before the batch's "
                "completion window expired"))
        else:
            running = _Running(item)
            self.running[key] = running
            running.task = asyncio.get_running_loop().create_task(self._run(running, batch))
            return True
        return False

    async def _run(self, running: _Running, batch: BatchRecord) -> None:
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
            self._settle(item, outcome)
        finally:
            self.running.pop((item.batch_id, item.custom_id), None)
            self._wake.set()

    def _settle(self, item: WorkItem, outcome: Outcome) -> None:
        counts = self.store.complete(item, outcome)
        if outcome.kind in (DONE_OK, DONE_FAILED):
            self.finished_at.append(self.wall())
        if counts.remaining <= 0:
            self.finalize(item.batch_id)

    def _batch(self, batch_id: str) -> BatchRecord | None:
        """The batch, re-read at most every `SWEEP_S` (another controller may cancel it)."""
        now = self.wall()
        cached = self.cache.get(batch_id)
        if cached is None or now - cached[0] > SWEEP_S:
            batch = self.store.get_batch(batch_id)
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
                self.finalize(batch.id)

    def finalize(self, batch_id: str) -> None:
        """Write the output and error files and close the batch (idempotent)."""
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
        self.store.put_file(FileRecord(file_id, f"{batch.id}_{name}.jsonl", "batch_output",
                                       len(content), int(self.wall())), content)
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
