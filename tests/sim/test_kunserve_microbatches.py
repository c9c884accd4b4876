"""A simulated pipeline group cuts each step into the real engine's microbatches, times
the step as their pipeline across the stages, and completes each microbatch's requests
when it leaves the last stage, so steps overlap (KunServe §4.3, §5)."""

from __future__ import annotations

import pytest

from andante.cluster.kunserve.lookahead import fit_chunk_cost, step_microbatches
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import Request
from andante.core.sampling import SamplingParams
from andante.engine.config import SchedulerConfig
from andante.exec.batch import StepBatch, StepResult
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


def _spy_steps(leader: KunSimInstance) -> list[tuple[StepBatch, StepResult]]:
    """The engine's whole steps, as `begin_step` forms them."""
    steps: list[tuple[StepBatch, StepResult]] = []
    begin = leader.engine.begin_step

    def spy() -> tuple[StepBatch, StepResult]:
        steps.append(begin())
        return steps[-1]
    leader.engine.begin_step = spy  # type: ignore[method-assign]
    return steps


def _drain(leader: KunSimInstance, until: float) -> None:
    leader.engine.clock.advance_to(until)  # type: ignore[attr-defined]
    while leader._pipeline:
        leader.finish_step()


@pytest.mark.parametrize("lookahead", [True, False])
def test_a_grouped_step_is_the_pipeline_of_the_engines_microbatches(lookahead: bool
                                                                      ) -> None:
    leader = _leader(lookahead)
    _fill(leader, [1500, 900, 300, 200])
    assert leader.engine.scheduler.config.max_num_batched_tokens == 2 * 2048  # a cycle
    steps = _spy_steps(leader)
    done = leader.begin_step(0.0)
    assert done is not None
    batch, result = steps[-1]
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
    _drain(leader, done)
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
        _drain(leader, done)
        shares[lookahead] = 1 - leader.stage_busy / leader.stage_capacity
    assert shares[True] < shares[False]


def test_each_microbatch_completes_on_its_own_and_the_next_step_overlaps() -> None:
    leader = _leader(lookahead=False)  # by_rows: rows r0, r1 | r2, r3
    _fill(leader, [200, 200, 200, 200])
    steps = _spy_steps(leader)
    last = leader.begin_step(0.0)
    assert last is not None and leader.num_in_flight == 2 and len(leader._pipeline) == 2
    first_rows = leader.completions()[0].batch
    reqs = {r.request_id: r for r in steps[0][0].requests}
    assert [r.request_id for r in first_rows.requests] == ["r0", "r1"]
    # r0, r1 leave the last stage first: they have their token then, r2, r3 not yet
    stage_seconds = leader.stage_times(*steps[0])[0][0]
    first_done = 2 * stage_seconds + leader._hop_latency + leader._hop_per_token * 400
    assert first_done < last
    leader.engine.clock.advance_to(first_done)  # type: ignore[attr-defined]
    leader.finish_step()
    assert reqs["r0"].timeline.token_times == [pytest.approx(first_done)]
    assert not reqs["r2"].timeline.token_times
    # stage 0 is free and one microbatch is in flight: the next step enters now, with
    # the requests not in flight (r0, r1's decodes) as one microbatch (one free slot)
    assert not leader.busy
    assert leader.begin_step(first_done) is not None
    assert [r.request_id for r in steps[1][0].requests] == ["r0", "r1"]
    assert steps[1][0].num_new_tokens == [1, 1] and leader.num_in_flight == 2
    assert leader.engine.scheduler.config.max_num_batched_tokens == 2 * 2048
    leader.engine.clock.advance_to(last)  # type: ignore[attr-defined]
    leader.finish_step()
    assert reqs["r2"].timeline.token_times == [pytest.approx(last)]
    assert len(reqs["r0"].timeline.token_times) == 1  # its decode is still in flight


def test_a_prompts_inner_chunk_lets_its_next_chunk_follow_at_once() -> None:
    leader = _leader(lookahead=False)
    _fill(leader, [5000])
    steps = _spy_steps(leader)
    last = leader.begin_step(0.0)  # an empty pipeline: a cycle's 4096 tokens, no sample
    assert last is not None and steps[0][0].num_new_tokens == [4096]
    first = leader.completions()[0]
    stage_seconds = leader.stage_times(*steps[0])[0][0]
    assert first.when == pytest.approx(stage_seconds)  # it left stage 0
    assert first.when < last
    assert first.retires == 0 and leader.num_in_flight == 1
    leader.engine.clock.advance_to(first.when)  # type: ignore[attr-defined]
    leader.finish_step()
    req = steps[0][0].requests[0]
    assert req.num_computed_tokens == 4096 and not req.timeline.token_times
    # its rest enters stage 0 now, behind the first chunk, which is still in stage 1
    assert not leader.busy and leader.begin_step(first.when) is not None
    assert steps[1][0].num_new_tokens == [904] and leader.num_in_flight == 2


@pytest.mark.parametrize("lookahead", [True, False])
def test_a_step_formed_beside_a_microbatch_in_flight_matches_its_cost(lookahead: bool
                                                                       ) -> None:
    leader = _leader(lookahead)
    _fill(leader, [200, 200, 200, 200])
    steps = _spy_steps(leader)
    last = leader.begin_step(0.0)
    assert last is not None and leader.num_in_flight == 2
    in_flight = leader.stage_times(*steps[0])  # each microbatch's time on a stage
    _fill_more(leader, "queued", 3000)  # a long prompt queues meanwhile
    first_done = leader.completions()[0].when
    leader.engine.clock.advance_to(first_done)  # type: ignore[attr-defined]
    leader.finish_step()
    assert leader.begin_step(first_done) is not None and leader.num_in_flight == 2
    batch = steps[1][0]
    (seconds, _), = leader.stage_times(*steps[1])
    beside = max(s for s, _ in in_flight)
    if lookahead:  # eq. (1) sizes the queued prompt's chunk to even the stages out
        assert batch.num_tokens < 2048 and seconds == pytest.approx(beside, rel=0.2)
    else:  # the slot's whole token budget: the stage beside it idles meanwhile
        assert batch.num_tokens == 2048 and seconds > 2 * beside


def _fill_more(leader: KunSimInstance, request_id: str, length: int) -> None:
    leader.engine.add_request(Request(request_id, list(range(length)),
                                      SamplingParams(max_tokens=4), arrival_time=0.0))
