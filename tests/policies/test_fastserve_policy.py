"""`fastserve` and `fastserve-fcfs` end to end: options, progress, latency on skew."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.policies import SchedulerConfig, policy_names
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec
from experiments.fastserve_runs import skewed_mix
from tests.engine.helpers import make_engine, make_request, run_to_completion


def test_registered_and_options_are_checked() -> None:
    assert {"fastserve", "fastserve-fcfs"} <= set(policy_names())
    with pytest.raises(ValueError, match="unknown option"):
        make_engine("fastserve", 16, options={"quantum": 1})
    with pytest.raises(ValueError, match="kv_mode"):
        make_engine("fastserve", 16, options={"kv_mode": "lazy"})
    with pytest.raises(ValueError, match="quantum_ratio"):
        make_engine("fastserve", 16, options={"quantum_ratio": 1.0})


def test_new_short_job_preempts_a_long_one_at_the_next_step() -> None:
    engine, executor, clock = make_engine(
        "fastserve", 64, options={"base_quantum": 0.01, "starve_limit": None},
        max_num_seqs=1)
    long = make_request("long", 8, 40)
    engine.add_request(long)
    for _ in range(5):
        engine.step()
        clock.advance_to(clock.now() + 0.01)
    short = make_request("short", 4, 2, arrival=clock.now())
    engine.add_request(short)
    out = engine.step()
    assert [r.request_id for r in out.batch.requests] == ["short"]  # token-level preemption
    run_to_completion(engine, clock)
    assert short.timeline.finish_time is not None and long.timeline.finish_time is not None
    assert short.timeline.finish_time < long.timeline.finish_time


def test_fcfs_ablation_runs_jobs_in_arrival_order() -> None:
    engine, executor, clock = make_engine("fastserve-fcfs", 64, max_num_seqs=1)
    engine.add_request(make_request("first", 30, 3))
    engine.add_request(make_request("second", 4, 3, arrival=0.001))
    run_to_completion(engine, clock)
    assert [b.requests[0].request_id for b in executor.batches] == ["first"] * 3 + ["second"] * 3


WORKLOAD = st.lists(
    st.tuples(st.integers(1, 30), st.integers(1, 20), st.integers(0, 5)),
    min_size=1, max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    workload=WORKLOAD,
    policy=st.sampled_from(["fastserve", "fastserve-fcfs"]),
    mode=st.sampled_from(["proactive", "reactive", "recompute"]),
    num_blocks=st.integers(min_value=9, max_value=40),
    num_host_blocks=st.integers(min_value=0, max_value=40),
    starve_limit=st.sampled_from([None, 0.02, 3.0]),
)
def test_everything_finishes_and_blocks_return(
    workload: list[tuple[int, int, int]], policy: str, mode: str, num_blocks: int,
    num_host_blocks: int, starve_limit: float | None,
) -> None:
    engine, _, clock = make_engine(
        policy, num_blocks, num_host_blocks=num_host_blocks, max_model_len=64,
        options={"kv_mode": mode, "starve_limit": starve_limit, "base_quantum": 0.01},
    )
    requests = [make_request(f"r{i}", p, o, arrival=s * 0.01)
                for i, (p, o, s) in enumerate(workload)]
    for req in requests:
        engine.add_request(req)
    run_to_completion(engine, clock)  # never stalls; KV invariants every step
    kv = engine.scheduler.kv
    assert kv.num_free_device_blocks == num_blocks
    assert kv.num_free_host_blocks == num_host_blocks
    assert all(r.is_finished for r in requests)


def mean_per_token_latency(policy: str, workload: list[RequestSpec]) -> float:
    spec = ClusterSpec(
        model="opt-13b", hardware="a100-40g", policy=policy, swap_space_gib=32,
        overlap_swaps=policy != "vllm",
        scheduler=SchedulerConfig(max_model_len=2048, max_num_batched_tokens=2048),
    )
    run = simulate(spec, workload)
    assert not run.report.unfinished
    return float(np.mean([(r.token_times[-1] - r.arrival_time) / r.num_output_tokens
                          for r in run.records]))


def test_fastserve_beats_vllm_on_a_skewed_workload() -> None:
    workload = skewed_mix(5.0, 150, seed=0)
    fastserve = mean_per_token_latency("fastserve", workload)
    vllm = mean_per_token_latency("vllm", workload)
    assert fastserve < 0.5 * vllm  # head-of-line blocking gone: several times lower
