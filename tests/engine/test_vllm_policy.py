from __future__ import annotations

import pytest

from andante.core import PreemptionMode, RequestStatus
from andante.engine import RequestRejected
from andante.engine.plan import StepPlan
from tests.engine.helpers import ScriptedPolicy, make_engine, make_request, run_to_completion

# ---- vllm: vLLM v1's loop ---------------------------------------------------------------


def test_v1_mixes_a_new_prefill_with_running_decodes() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=64)
    engine.add_request(make_request("a", 4, 10))
    engine.step()
    engine.add_request(make_request("b", 4, 10, arrival=0.01))
    out = engine.step()
    assert [r.request_id for r in out.batch.requests] == ["a", "b"]
    assert out.batch.num_new_tokens == [1, 4]


def test_v1_chunks_prefills_by_the_token_budget() -> None:
    engine, executor, clock = make_engine(
        "vllm", num_device_blocks=64, max_num_batched_tokens=16, max_model_len=16
    )
    engine.add_request(make_request("a", 12, 3))
    engine.add_request(make_request("b", 12, 3, arrival=0.001))
    engine.step()
    engine.step()
    first, second = executor.batches
    assert first.num_new_tokens == [12, 4] and first.samples == [True, False]
    # a decodes first, then b's prefill continues where its first chunk stopped
    assert second.num_new_tokens == [1, 8] and second.num_cached_tokens == [12, 4]
    run_to_completion(engine, clock)
    assert max(b.num_tokens for b in executor.batches) <= 16


def test_v1_preempts_from_the_back_and_admits_nothing_in_that_step() -> None:
    # 3 blocks of 4: a and b fill them; c waits. When a needs a block, b (the back) goes.
    engine, _, clock = make_engine("vllm", num_device_blocks=3)
    a, b = make_request("a", 4, 6), make_request("b", 4, 6, arrival=0.001)
    c = make_request("c", 1, 1, arrival=0.002)
    for req in (a, b):
        engine.add_request(req)
    engine.step()  # a and b prefilled: 2 blocks
    engine.add_request(c)
    out = engine.step()  # a and b need a block each: one fits, the back (b) is preempted
    assert b.timeline.num_recomputes == 1 and a.timeline.num_recomputes == 0
    assert [r.request_id for r in out.batch.requests] == ["a"]  # no admission of c
    run_to_completion(engine, clock)
    assert all(r.num_output_tokens == r.sampling.max_tokens for r in (a, b, c))


# ---- vllm-v0: prefill-first -----------------------------------------------------------


def test_v0_prefill_first_then_decode_all_finish() -> None:
    engine, executor, clock = make_engine("vllm-v0", num_device_blocks=64)
    for i in range(3):
        engine.add_request(make_request(f"r{i}", prompt_len=6, max_tokens=4))
    run_to_completion(engine, clock)
    first = executor.batches[0]
    assert first.num_new_tokens == [6, 6, 6] and all(first.samples)
    assert all(b.num_new_tokens == [1, 1, 1] for b in executor.batches[1:])
    assert len(executor.batches) == 4  # one prefill + three decodes
    assert engine.scheduler.kv.num_free_device_blocks == 64


def test_v0_prefill_first_pauses_decodes_while_admitting() -> None:
    engine, executor, clock = make_engine("vllm-v0", num_device_blocks=64)
    engine.add_request(make_request("a", 4, 10))
    engine.step()
    engine.add_request(make_request("b", 4, 10, arrival=0.01))
    out = engine.step()
    assert [r.request_id for r in out.batch.requests] == ["b"]
    out = engine.step()
    assert [r.request_id for r in out.batch.requests] == ["a", "b"]


@pytest.mark.parametrize("policy", ["vllm", "vllm-v0"])
def test_block_shortage_recomputes_newest_and_output_continues(policy: str) -> None:
    # 2 requests of 4-token prompts, blocks of 4, 4 blocks: they collide while decoding.
    engine, executor, clock = make_engine(policy, num_device_blocks=4)
    a, b = make_request("a", 4, 8), make_request("b", 4, 8, arrival=0.001)
    engine.add_request(a)
    engine.add_request(b)
    run_to_completion(engine, clock)
    assert b.timeline.num_recomputes >= 1 and a.timeline.num_recomputes == 0
    assert a.num_output_tokens == 8 and b.num_output_tokens == 8
    # the fake sampler emits 1000 + position: a re-prefill continues the same sequence
    assert b.output_token_ids == [1000 + 4 + i for i in range(8)]
    assert engine.scheduler.num_preemptions >= 1


@pytest.mark.parametrize("policy", ["vllm", "vllm-v0"])
def test_swap_mode_swaps_the_newest_out_and_brings_it_back(policy: str) -> None:
    engine, executor, clock = make_engine(
        policy, num_device_blocks=4, num_host_blocks=8, preemption_mode=PreemptionMode.SWAP
    )
    a, b = make_request("a", 4, 8), make_request("b", 4, 8, arrival=0.001)
    engine.add_request(a)
    engine.add_request(b)
    run_to_completion(engine, clock)
    assert b.timeline.num_swaps_out >= 1 and a.timeline.num_swaps_out == 0
    assert b.timeline.num_recomputes == 0
    assert any(batch.swap_out for batch in executor.batches)
    assert any(batch.swap_in for batch in executor.batches)
    assert b.output_token_ids == [1000 + 4 + i for i in range(8)]


# ---- the plan reserves through the block manager ------------------------------------


def test_plan_decisions_are_the_block_managers_books() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=4, num_host_blocks=2)
    a, b = make_request("a", 8, 4), make_request("b", 8, 4, arrival=0.001)
    engine.add_request(a)
    engine.add_request(b)
    engine.step()  # 2 blocks each: the device is full
    kv, seen = engine.scheduler.kv, []

    def swap_b_out_then_in_and_try_a(plan: StepPlan) -> None:
        if b.status == RequestStatus.RUNNING:
            plan.preempt(b, PreemptionMode.SWAP)
            seen.append((plan.num_free_blocks, plan.num_free_host_blocks))
            return
        plan.swap_in(b)  # takes the device's 2 free blocks; its host blocks are read
        # this step, so a swap-out decided now must not overwrite them: none is offered
        assert not plan.can_preempt(a, PreemptionMode.SWAP)
        assert plan.preemption_mode_for(a) == PreemptionMode.RECOMPUTE
        seen.append((plan.num_free_blocks, plan.num_free_host_blocks))

    engine.scheduler.policy = ScriptedPolicy(swap_b_out_then_in_and_try_a)
    engine.step()
    engine.step()
    assert seen == [(2, 0), (0, 0)]  # the plan's figures are the block manager's
    assert kv.num_free_host_blocks == 2  # released once the step's swaps were decided
    assert a.status == b.status == RequestStatus.RUNNING
    kv.check_invariants()


def test_a_refused_schedule_allocates_nothing() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=4)
    engine.add_request(make_request("a", 12, 2))
    engine.step()  # 3 blocks
    big = make_request("big", 8, 2, arrival=0.01)
    engine.add_request(big)

    def try_big(plan: StepPlan) -> None:
        assert not plan.can_schedule(big, 8) and plan.max_schedulable_tokens(big) == 4
        with pytest.raises(ValueError, match="cannot schedule"):
            plan.schedule(big, 8)
        assert plan.num_free_blocks == 1 and not plan.scheduled

    engine.scheduler.policy = ScriptedPolicy(try_big)
    engine.scheduler.schedule()  # the plan alone (an empty step is the engine's stall)


# ---- admission and aborts (any policy) ----------------------------------------------


def test_prompt_that_can_never_fit_is_rejected() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=4, max_model_len=64)
    with pytest.raises(RequestRejected, match="KV cache"):
        engine.add_request(make_request("big", 40, 1))
    with pytest.raises(RequestRejected, match="context"):
        engine.add_request(make_request("long", 64, 1))


def test_request_growing_past_the_cache_is_capped_not_stuck() -> None:
    engine, _, clock = make_engine("vllm", num_device_blocks=2)
    req = make_request("a", 4, 100)
    engine.add_request(req)
    run_to_completion(engine, clock)
    assert req.status == RequestStatus.FINISHED_LENGTH
    assert req.num_tokens == 8  # 2 blocks of 4 tokens


def test_abort_frees_blocks_on_next_step() -> None:
    engine, _, clock = make_engine("vllm", num_device_blocks=16)
    engine.add_request(make_request("a", 8, 50))
    engine.step()
    assert engine.scheduler.kv.num_free_device_blocks < 16
    engine.abort("a")
    out = engine.step()
    assert [r.request_id for r in out.finished] == ["a"]
    assert out.finished[0].status == RequestStatus.FINISHED_ABORTED
    assert engine.scheduler.kv.num_free_device_blocks == 16
    assert not engine.has_work


def test_submit_rejects_through_the_step_output() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=2)
    engine.submit(make_request("big", 40, 1))
    out = engine.step()
    assert out.finished[0].status == RequestStatus.FINISHED_REJECTED
