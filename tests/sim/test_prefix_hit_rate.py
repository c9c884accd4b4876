"""The simulator's prefix-cache hit rate equals the analytic value on generated
conversation and system-prompt workloads (turns far apart: nothing is in flight or
evicted when a turn arrives)."""

from __future__ import annotations

import dataclasses

import pytest

from andante.engine.config import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import WorkloadConfig, build_workload
from andante.workload.prefix import expected_hit_tokens


def _workload(sharing: str, n: int = 24) -> list:
    return build_workload(WorkloadConfig(kind="poisson", rate=0.2, num_requests=n,
                                         lengths="uniform:20:90:5:40", seed=3,
                                         prefix_sharing=sharing))


@pytest.mark.parametrize("sharing", ["conversation:4", "system:200", "conversation:3:40"])
def test_hit_rate_equals_the_analytic_value(sharing: str) -> None:
    workload = _workload(sharing)
    run = simulate(ClusterSpec(), workload)
    expected = expected_hit_tokens(workload, block_size=16)
    records = sorted(run.records, key=lambda r: int(r.request_id.split("-")[1]))
    assert [r.num_prefix_hit_tokens for r in records] == expected
    queried = sum(spec.prompt_len for spec in workload)
    assert run.summary.saved_prefill_tokens == sum(expected) > 0
    assert run.summary.prefix_cache_hit_rate == pytest.approx(sum(expected) / queried)


def test_switched_off_the_simulator_saves_nothing_and_prefills_longer() -> None:
    workload = _workload("conversation:2", n=12)
    on = simulate(ClusterSpec(), workload).summary
    spec = ClusterSpec(scheduler=SchedulerConfig(enable_prefix_caching=False))
    off = simulate(spec, workload).summary
    assert off.saved_prefill_tokens == 0 and off.prefix_cache_hit_rate != off.prefix_cache_hit_rate
    assert on.saved_prefill_tokens > 0
    assert on.ttft.mean < off.ttft.mean


def test_requests_without_content_ids_are_not_cached() -> None:
    workload = [dataclasses.replace(s, prefix=None) for s in _workload("system:200", n=6)]
    summary = simulate(ClusterSpec(), workload).summary
    assert summary.saved_prefill_tokens == 0
