"""KunServe's dispatcher balances by Llumnix's freeness (KunServe §3), not by predicted
drain time: a just-restored leader holding long decodes but free memory gets arrivals
while an emptied member's queue grows; requests in transit count against a unit."""

from __future__ import annotations

from dataclasses import dataclass

from andante.cluster.kunserve.router import KunServeRouter, dispatch_freeness
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
           blocks: int = 14_000) -> SchedulerStats:
    return SchedulerStats(num_running=running, num_waiting=waiting, num_blocks=blocks,
                          num_free_blocks=free, num_queued_kv_blocks=queued_blocks)


def _request() -> Request:
    return Request("r", [1] * 100, SamplingParams(max_tokens=10), 0.0)


def test_a_restored_leader_with_free_memory_takes_arrivals_despite_long_drain() -> None:
    leader = View(0, _stats(running=119, free=8_000), drain_time=42.0)
    member = View(1, _stats(running=160, free=8_000, queued_blocks=3_000, waiting=100),
                  drain_time=30.0)
    assert KunServeRouter().route(_request(), [leader, member]) == 0


def test_in_transit_requests_count_as_running_ones() -> None:
    view = View(0, _stats(running=10, free=9_000))  # 500 blocks per running request
    base = dispatch_freeness(view)
    view.num_in_transit = 10
    assert dispatch_freeness(view) == (9_000 - 10 * 500) / 20 < base


def test_dead_units_are_skipped_and_none_alive_keeps_the_request_queued() -> None:
    dead = View(0, _stats(running=0, free=14_000), alive=False)
    busy = View(1, _stats(running=200, free=100))
    assert KunServeRouter().route(_request(), [dead, busy]) == 1
    busy.alive = False
    assert KunServeRouter().route(_request(), [dead, busy]) is None
