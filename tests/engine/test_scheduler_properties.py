"""Property test: any workload under any baseline policy finishes and leaks nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import PreemptionMode
from tests.engine.helpers import make_engine, make_request, run_to_completion

BASELINES = ["vllm", "vllm-v0", "sarathi", "priority", "edf", "qlm-edf", "sjf"]

WORKLOAD = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=30),  # prompt
        st.integers(min_value=1, max_value=20),  # output
        st.integers(min_value=0, max_value=3),  # priority
        st.integers(min_value=0, max_value=5),  # arrival step
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=120, deadline=None)
@given(
    workload=WORKLOAD,
    policy=st.sampled_from(BASELINES),
    num_blocks=st.integers(min_value=9, max_value=40),
    swap=st.booleans(),
    watermark=st.sampled_from([0.0, 0.05]),
)
def test_everything_finishes_and_blocks_return(
    workload: list[tuple[int, int, int, int]], policy: str, num_blocks: int, swap: bool,
    watermark: float,
) -> None:
    mode = PreemptionMode.SWAP if swap else PreemptionMode.RECOMPUTE
    engine, _, clock = make_engine(
        policy, num_blocks, num_host_blocks=16, preemption_mode=mode, max_model_len=64,
        watermark=watermark,
    )
    requests = [
        make_request(f"r{i}", p, o, arrival=step * 0.01, priority=prio)
        for i, (p, o, prio, step) in enumerate(workload)
    ]
    for req in requests:
        engine.add_request(req)
    run_to_completion(engine, clock)
    kv = engine.scheduler.kv
    assert kv.num_free_device_blocks == num_blocks and kv.num_free_host_blocks == 16
    for req in requests:
        assert req.is_finished
        capped = kv.num_blocks_for(req.num_tokens + 1) > num_blocks
        assert req.num_output_tokens == req.sampling.max_tokens or capped
        assert len(req.timeline.token_times) == req.num_output_tokens
