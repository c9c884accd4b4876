"""Simulated prompts have content of their own (issue 30 item 4): vLLM v1 with automatic
prefix caching hashes every prompt, so a request preempted by recompute finds its freed
blocks again instead of re-prefilling them; without that the simulated vLLM loop
preempted the same long prompts ~50 times each under KV pressure."""

from __future__ import annotations

import pytest

from andante.engine.config import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.sim.setup import build_simulator
from andante.workload.spec import RequestSpec

WORKLOAD = [RequestSpec(arrival_time=0.5 * i, prompt_len=3000 + 37 * i, output_len=400)
            for i in range(12)]


def _run(policy: str, caching: bool) -> tuple[float, float]:
    spec = ClusterSpec(policy=policy, num_kv_blocks=400, scheduler=SchedulerConfig(
        enable_prefix_caching=caching, max_num_batched_tokens=512))
    run = simulate(spec, WORKLOAD)
    assert run.summary.num_finished == len(WORKLOAD)
    preemptions = sum(len(r.timeline.preemption_times) for r in run.requests)
    return preemptions / len(WORKLOAD), run.report.end_time


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_kv_pressure_preempts_about_once_per_request_with_caching(policy: str) -> None:
    with_cache, end_with = _run(policy, True)
    without, end_without = _run(policy, False)
    assert with_cache < 2.0  # before: 49 per request, as without the cache
    assert without > 10.0  # the pressure is real: recomputing from scratch loops
    assert end_with < end_without


def test_num_kv_blocks_sets_the_device_tier() -> None:
    simulator = build_simulator(ClusterSpec(num_kv_blocks=123))
    assert simulator.instances[0].engine.scheduler.kv.num_device_blocks == 123
    with pytest.raises(ValueError, match="num_kv_blocks"):
        ClusterSpec(num_kv_blocks=0)
