"""Moving a member's requests into the group leader: progress kept, KV moves listed."""

from __future__ import annotations

from andante.cluster.kunserve.adopt import adopt_group, kv_moves, whole_model
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import RequestStatus
from tests.engine.helpers import make_engine, make_request, run_to_completion

NUM_LAYERS = 4


def _busy_engine(prefix: str, num_blocks: int = 32, num_running: int = 2, num_waiting: int = 2):
    engine, executor, clock = make_engine("vllm", num_blocks, max_num_seqs=num_running)
    for i in range(num_running + num_waiting):
        engine.submit(make_request(f"{prefix}{i}", prompt_len=6, max_tokens=5))
    for _ in range(2):  # prefill + one decode for the first `num_running`
        batch, result = engine.begin_step()
        clock.advance_to(clock.now() + result.duration)
        engine.finish_step(batch, result)
    return engine, clock


def test_kv_moves_between_two_whole_models_to_halves() -> None:
    plan = GroupPlan((0, 1), ((0, 2), (2, 4)))
    # a request of member 1 (all layers on 1, blocks 5, 6) lands in blocks 0, 1
    moves = kv_moves("r", whole_model(1, NUM_LAYERS), [5, 6], plan, [0, 1])
    assert {(m.src_member, m.src_block, m.dst_member, m.dst_block, m.layers) for m in moves} == {
        (1, 5, 0, 0, (0, 2)), (1, 6, 0, 1, (0, 2)),
        (1, 5, 1, 0, (2, 4)), (1, 6, 1, 1, (2, 4)),
    }
    # the leader's own request (blocks unchanged): only the layers it drops move
    own = kv_moves("q", whole_model(0, NUM_LAYERS), [3], plan, [3])
    assert [(m.src_member, m.dst_member, m.layers) for m in own] == [(0, 1, (2, 4))]


def test_group_adopts_member_requests_with_progress() -> None:
    leader, leader_clock = _busy_engine("a")
    member, _ = _busy_engine("b")
    leader.scheduler.kv.resize_device(64)  # the dropped layers' memory
    before = {rid: (r.num_computed_tokens, list(r.output_token_ids), r.status)
              for rid, r in member.scheduler.requests.items()}
    running_b = [r.request_id for r in member.scheduler.running]
    plan = GroupPlan((0, 1), ((0, 2), (2, 4)))
    result = adopt_group([(leader.scheduler, whole_model(0, NUM_LAYERS)),
                          (member.scheduler, whole_model(1, NUM_LAYERS))],
                         leader.scheduler, plan)
    assert not member.scheduler.requests
    assert member.scheduler.kv.num_free_device_blocks == member.scheduler.kv.num_device_blocks
    assert len(leader.scheduler.requests) == 8
    assert result.num_requests == 8 and not result.recomputed
    for rid, (computed, output, status) in before.items():
        req = leader.scheduler.requests[rid]
        assert (req.num_computed_tokens, list(req.output_token_ids), req.status) == (
            computed, output, status)
    for rid in running_b:  # a new table covering the computed tokens; every block moves
        table = leader.scheduler.kv.block_table(rid)
        assert len(table) == leader.scheduler.kv.num_blocks_for(
            leader.scheduler.requests[rid].num_computed_tokens)
        assert sum(m.request_id == rid for m in result.moves) == 2 * len(table)
    leader.scheduler.kv.check_invariants()
    # the group serves everything to the end
    run_to_completion(leader, leader_clock)
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in result.adopted)


def test_recompute_mode_and_no_room_fall_back_to_recompute() -> None:
    leader, leader_clock = _busy_engine("a")
    member, _ = _busy_engine("b")
    plan = GroupPlan((0, 1), ((0, 2), (2, 4)), kv_mode="recompute")
    result = adopt_group([(leader.scheduler, whole_model(0, NUM_LAYERS)),
                          (member.scheduler, whole_model(1, NUM_LAYERS))],
                         leader.scheduler, plan)
    assert not result.moves and len(result.recomputed) == 4 and len(result.requeued) == 4
    assert all(r.status == RequestStatus.PREEMPTED and r.num_computed_tokens == 0
               for r in result.recomputed)
    assert leader.scheduler.kv.num_free_device_blocks == leader.scheduler.kv.num_device_blocks
    run_to_completion(leader, leader_clock)
    assert all(r.is_finished for r in result.recomputed + result.requeued)


def test_running_request_that_does_not_fit_is_recomputed() -> None:
    leader, _ = _busy_engine("a", num_blocks=4, num_running=2, num_waiting=0)
    member, _ = _busy_engine("b", num_running=2, num_waiting=0)
    plan = GroupPlan((0, 1), ((0, 2), (2, 4)))
    result = adopt_group([(leader.scheduler, whole_model(0, NUM_LAYERS)),
                          (member.scheduler, whole_model(1, NUM_LAYERS))],
                         leader.scheduler, plan)
    assert len(result.adopted) == 2 and len(result.recomputed) == 2
    assert result.num_requests == 4
    leader.scheduler.kv.check_invariants()
