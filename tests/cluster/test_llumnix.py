"""The Llumnix-like baseline: freeness, pairing, which request moves, and that it
migrates running requests' KV under pressure (so it is not vLLM under another name)."""

from __future__ import annotations

import pytest

from andante.cluster.llumnix import (
    LlumnixRouter,
    MigrationPair,
    freeness,
    migration_pairs,
    pick_running,
)
from andante.core.request import RequestStatus
from andante.engine.config import SchedulerConfig
from andante.engine.stats import SchedulerStats
from andante.sim.setup import build_simulator
from andante.sim.spec import ClusterSpec
from andante.workload.spec import RequestSpec, to_requests


def _stats(free: int, queued: int, running: int) -> SchedulerStats:
    return SchedulerStats(num_free_blocks=free, num_blocks=1000, num_queued_kv_blocks=queued,
                          num_running=running, num_waiting=1 if queued else 0)


def test_a_blocked_queue_makes_freeness_negative() -> None:
    assert freeness(_stats(100, 0, 10)) == 10
    assert freeness(_stats(10, 50, 10)) == -4
    assert freeness(_stats(5, 0, 0)) == 5  # no batch: per one request


def test_pairs_least_free_source_with_freest_destination() -> None:
    loads = [(0, _stats(10, 60, 10)), (1, _stats(300, 0, 10)), (2, _stats(80, 0, 10)),
             (3, _stats(0, 20, 10))]
    pairs = migration_pairs(loads, out_threshold=1.0, in_threshold=4.0, gap=2.0)
    assert pairs == [MigrationPair(0, 1), MigrationPair(3, 2)]


def test_no_pair_when_balanced_or_nobody_has_room() -> None:
    even = [(0, _stats(0, 30, 10)), (1, _stats(0, 30, 10))]
    assert migration_pairs(even, 1.0, 4.0, 2.0) == []
    calm = [(0, _stats(200, 0, 10)), (1, _stats(300, 0, 10))]
    assert migration_pairs(calm, 1.0, 4.0, 2.0) == []


def test_pick_running_takes_the_smallest_that_fits() -> None:
    candidates = [("a", 40), ("b", 7), ("c", 12)]
    assert pick_running(candidates, free_blocks=20) == "b"
    assert pick_running(candidates, free_blocks=7, reserve_blocks=1) is None
    assert pick_running([], free_blocks=100) is None


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="gap"):
        LlumnixRouter(gap=0)
    with pytest.raises(ValueError, match="in_threshold"):
        LlumnixRouter(out_threshold=5, in_threshold=1)


def _run(router: str) -> tuple[list[float], dict[str, int]]:
    spec = ClusterSpec(
        model="llama-3.1-8b", hardware="a10-24g", num_instances=2, router=router,
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=128,
                                  max_model_len=8192))
    # dispatch alternates at one instant: the long answers pile up on instance 0, whose
    # KV runs out while instance 1's short requests leave
    specs = [RequestSpec(0.0, 400, 1500 if i % 2 == 0 else 5) for i in range(90)]
    specs += [RequestSpec(5.0 + 0.1 * i, 400, 200) for i in range(60)]
    requests = to_requests(specs)
    report = build_simulator(spec).run(requests)
    assert not report.unfinished
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    return [r.timeline.token_times[0] - r.arrival_time for r in requests], \
        dict(report.router_counters)


def test_llumnix_migrates_kv_under_pressure_and_differs_from_vllm() -> None:
    plain, _ = _run("least-loaded")
    migrated, counters = _run("llumnix")
    assert counters["num_running_migrations"] > 0 and counters["kv_bytes_migrated"] > 0
    assert migrated != plain
    assert sum(migrated) < 0.8 * sum(plain)  # the queue behind the long answers drains
