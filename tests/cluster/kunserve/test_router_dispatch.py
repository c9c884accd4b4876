"""KunServe's dispatcher (KunServe §3, with Llumnix's freeness): a unit that would start a
request at its next step first, then the least-loaded's expected wait; a just-restored
leader holding long decodes but free memory gets arrivals while an emptied member's
queue grows; requests in transit count against a unit."""

from __future__ import annotations

from dataclasses import dataclass

from andante.cluster.kunserve.router import (
    KunServeRouter,
    can_take_now,
    dispatch_freeness,
    dispatch_key,
)
from andante.cluster.load import LoadReport
from andante.core.request import Request, SamplingParams
from andante.engine.stats import SchedulerStats


@dataclass
class View:
    index: int
    stats: SchedulerStats
    drain_time: float = 0.0
    num_in_transit: int = 0
    role: str = "any"
    alive: bool = True

    @property
    def load(self) -> LoadReport:
        return LoadReport(self.stats, drain_time=self.drain_time)


def _stats(running: int, free: int, queued_blocks: int = 0, waiting: int = 0,
           blocks: int = 14_000, queued_tokens: int = 0, cap: int = 256) -> SchedulerStats:
    return SchedulerStats(num_running=running, num_waiting=waiting, num_blocks=blocks,
                          num_free_blocks=free, num_queued_kv_blocks=queued_blocks,
                          num_uncomputed_tokens=running + waiting + queued_tokens,
                          max_num_seqs=cap)


def _request() -> Request:
    return Request("r", [1] * 100, SamplingParams(max_tokens=10), 0.0)


def test_a_restored_leader_with_free_memory_takes_arrivals_despite_long_drain() -> None:
    leader = View(0, _stats(running=119, free=8_000), drain_time=42.0)
    member = View(1, _stats(running=150, free=8_000, queued_blocks=3_000, waiting=90,
                            queued_tokens=50_000), drain_time=30.0)
    assert KunServeRouter().route(_request(), [leader, member]) == 0


def test_in_transit_requests_count_as_running_ones() -> None:
    view = View(0, _stats(running=10, free=9_000))  # 500 blocks per running request
    base = dispatch_freeness(view)
    view.num_in_transit = 10
    assert dispatch_freeness(view) == (9_000 - 10 * 500) / 20 < base


def test_a_unit_that_would_start_it_at_once_wins_then_the_expected_wait() -> None:
    full = View(0, _stats(running=256, free=5_000), drain_time=1.0)  # no sequence slot
    queue = View(1, _stats(running=100, free=5_000, waiting=2, queued_tokens=4_000,
                           queued_blocks=250), drain_time=5.0)
    free = View(2, _stats(running=100, free=5_000), drain_time=60.0)
    assert not can_take_now(full) and not can_take_now(queue) and can_take_now(free)
    assert dispatch_key(free) < dispatch_key(full)
    assert KunServeRouter().route(_request(), [full, queue, free]) == 2
    free.num_in_transit = 1  # one sent already: it would queue behind that one
    assert KunServeRouter().route(_request(), [full, queue, free]) == 0  # least drain
    no_memory = View(3, _stats(running=10, free=100, queued_blocks=200))
    assert not can_take_now(no_memory)


def test_dead_units_are_skipped_and_none_alive_keeps_the_request_queued() -> None:
    dead = View(0, _stats(running=0, free=14_000), alive=False)
    busy = View(1, _stats(running=200, free=100))
    assert KunServeRouter().route(_request(), [dead, busy]) == 1
    busy.alive = False
    assert KunServeRouter().route(_request(), [dead, busy]) is None
