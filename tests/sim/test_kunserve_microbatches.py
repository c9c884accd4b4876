"""A simulated pipeline group cuts each step into the real engine's microbatches and
times the step as their pipeline across the stages (KunServe §4.3, §5)."""

from __future__ import annotations

import pytest

from andante.cluster.kunserve.lookahead import fit_chunk_cost, step_microbatches
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import Request
from andante.core.sampling import SamplingParams
from andante.engine.config import SchedulerConfig
from andante.exec.microbatch import by_rows, sub_batch
from andante.exec.sim_executor import SimExecutor
from andante.sim.kunserve_instance import KunSimInstance
from andante.sim.setup import build_simulator
from andante.sim.spec import ClusterSpec

PLAN = GroupPlan((0, 1), ((0, 16), (16, 32)))


def _leader(lookahead: bool) -> KunSimInstance:
    spec = ClusterSpec(
        model="llama-3.1-8b", hardware="a10-24g", num_instances=2, router="kunserve",
        router_options={"lookahead": lookahead},
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=128,
                                  max_model_len=8192))
    sim = build_simulator(spec)
    leader: KunSimInstance = sim.instances[0]  # type: ignore[assignment]
    leader.become_stage_leader(PLAN)
    return leader


def _fill(leader: KunSimInstance, prompts: list[int]) -> None:
    for i, length in enumerate(prompts):
        leader.engine.add_request(Request(f"r{i}", list(range(length)),
                                          SamplingParams(max_tokens=4), arrival_time=0.0))


@pytest.mark.parametrize("lookahead", [True, False])
def test_a_grouped_step_is_the_pipeline_of_the_engines_microbatches(lookahead: bool
                                                                      ) -> None:
    leader = _leader(lookahead)
    _fill(leader, [1500, 900, 300, 200])
    assert leader.engine.scheduler.config.max_num_batched_tokens == 2 * 2048  # a cycle
    done = leader.begin_step(0.0)
    assert done is not None
    batch, result = leader._pipeline[-1]
    executor: SimExecutor = leader.engine.executor  # type: ignore[assignment]
    expected_plan = (step_microbatches(batch, 2, fit_chunk_cost(executor.cost_model),
                                       min_tokens=16)
                     if lookahead else by_rows(batch, 2))
    assert len(expected_plan) == 2
    times = [executor.forward_time(sub_batch(batch, p)[0]) for p in expected_plan]
    assert [t for t, _ in leader.stage_times(batch, result)] == pytest.approx(times)
    hop = leader._hop_latency + leader._hop_per_token * sub_batch(batch, expected_plan[0])[
        0].num_tokens
    hop2 = leader._hop_latency + leader._hop_per_token * sub_batch(batch, expected_plan[1])[
        0].num_tokens
    # stage 0 runs m0 then m1; stage 1 runs m0 after its hop, then m1 once both are ready
    m0_last = times[0] + hop + times[0]
    expected_done = max(m0_last, times[0] + times[1] + hop2) + times[1]
    assert done == pytest.approx(expected_done)
    leader.engine.clock.advance_to(done)  # type: ignore[attr-defined]
    leader.finish_step()
    busy = 2 * sum(times)
    assert leader.stage_busy == pytest.approx(busy)
    assert leader.stage_capacity == pytest.approx(2 * done)  # fill and drain are bubbles


def test_balanced_cuts_leave_fewer_bubbles_than_equal_rows() -> None:
    shares = {}
    for lookahead in (True, False):
        leader = _leader(lookahead)
        _fill(leader, [3000, 40, 40, 40])  # one long prompt, three short ones
        done = leader.begin_step(0.0)
        assert done is not None
        leader.engine.clock.advance_to(done)  # type: ignore[attr-defined]
        leader.finish_step()
        shares[lookahead] = 1 - leader.stage_busy / leader.stage_capacity
    assert shares[True] < shares[False]
