"""Ascendra's HP instance: prefill-first FCFS with an elastic batch (§6.2)."""

from __future__ import annotations

from andante.kv import KVBlockManager
from andante.policies.ascendra import AscendraHPPolicy
from tests.policies.ascendra_helpers import engine, request, step


def test_prefills_first_in_arrival_order_within_the_token_budget() -> None:
    eng, clock = engine("ascendra-hp", {"token_budget": 1000}, max_num_seqs=512)
    eng.add_request(request("late", 300, arrival=0.2))
    eng.add_request(request("early", 600, arrival=0.1))
    eng.add_request(request("huge", 3000, arrival=0.3))
    batch, _ = eng.begin_step()
    assert [r.request_id for r in batch.requests] == ["early", "late"]  # 900 <= 1000
    clock.advance_to(1.0)
    eng.finish_step(batch, _)
    batch, _ = eng.begin_step()  # a prompt over the budget runs alone; decodes ride along
    assert [r.request_id for r in batch.requests] == ["huge", "early", "late"]
    assert batch.num_new_tokens == [3000, 1, 1]


def test_decodes_wait_for_prefill_free_steps_when_not_mixed() -> None:
    eng, clock = engine("ascendra-hp", {"mixed": False}, max_num_seqs=512)
    eng.add_request(request("a", 100))
    step(eng, clock)
    eng.add_request(request("b", 100, arrival=clock.now()))
    batch, _ = eng.begin_step()
    assert [r.request_id for r in batch.requests] == ["b"]  # a's decode stalls


def _admitted(elastic: bool, blocks: int) -> int:
    eng, clock = engine("ascendra-hp", {"base_batch": 4, "elastic": elastic,
                                         "free_kv_share": 0.10}, max_num_seqs=512)
    config = eng.scheduler.config
    eng.scheduler.kv = KVBlockManager(config.block_size, blocks, watermark=config.watermark)
    for i in range(40):
        eng.add_request(request(f"r{i}", 160, max_tokens=300))
    batch, _ = eng.begin_step()
    return len(batch.requests)


def test_elastic_batch_grows_while_kv_stays_free() -> None:
    assert _admitted(elastic=False, blocks=10_000) == 4  # the base batch
    roomy = _admitted(elastic=True, blocks=10_000)
    assert roomy > 4  # grows past it (up to the 2,048-token budget: 12 prompts)
    tight = _admitted(elastic=True, blocks=250)  # 11 blocks per prompt + decode reserve
    assert 4 <= tight < roomy


def test_decode_reserve_follows_the_decode_length_history() -> None:
    eng, clock = engine("ascendra-hp", max_num_seqs=512)
    policy = eng.scheduler.policy
    assert isinstance(policy, AscendraHPPolicy)
    for i in range(3):
        eng.add_request(request(f"r{i}", 64, max_tokens=32))
    while eng.has_work:
        step(eng, clock)
    assert policy.decode_lengths.mean == 32
