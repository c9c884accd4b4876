"""An instance with work and no progress (issue 30 item 2): the step finds it, refuses
one request with a reason and goes on; the simulation says so in its result."""

from __future__ import annotations

import pytest

from andante.core.request import RequestStatus
from andante.sim import ClusterSpec, simulate
from andante.workload.spec import RequestSpec
from tests.engine.helpers import make_engine, make_request

POLICIES = ["vllm", "lqsf", "fastserve-fcfs", "fastserve", "sarathi", "sjf"]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_prompt_above_the_watermark_is_refused_not_left_waiting(policy: str) -> None:
    # 10 blocks of 4 tokens, 1 kept free for admissions: a 37-token prompt fits the
    # cache (check_fits) but can never be admitted.
    engine, _, clock = make_engine(policy, 10, watermark=0.1, max_num_batched_tokens=64,
                                   max_model_len=40)
    stuck = make_request("stuck", 37, 2)
    engine.add_request(stuck)
    engine.add_request(make_request("small", 5, 3, arrival=0.001))
    finished: list[str] = []
    for _ in range(50):
        if not engine.has_work:
            break
        out = engine.step()
        clock.advance_to(clock.now() + out.result.duration)
        finished += [r.request_id for r in out.finished]
    assert not engine.has_work  # before: an empty step forever (a server spins on it)
    assert stuck.status == RequestStatus.FINISHED_REJECTED
    assert "stalled" in (stuck.timeline.rejection_reason or "")
    assert set(finished) == {"stuck", "small"} and engine.num_stalls == 1
    engine.scheduler.kv.check_invariants()


def test_the_simulation_reports_the_stall_and_leaves_nothing_unfinished() -> None:
    workload = [RequestSpec(0.0, 1590, 5), RequestSpec(0.5, 100, 5)]
    run = simulate(ClusterSpec(num_kv_blocks=100), workload)
    assert not run.report.unfinished
    assert run.summary.num_finished == 1 and run.summary.num_rejected == 1
    assert run.report.num_stalls == 1
    assert "needs 100 KV blocks" in run.summary.first_rejections[0]
