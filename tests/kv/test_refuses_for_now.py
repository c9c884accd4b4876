"""`KVBlockManager.refuses_for_now`, fused for the run-ahead proofs' loop over a long
queue (issue 30, item 7), answers as its definition does: a swapped request's swap-in
check, else `hit_is_settled` and not `can_allocate`, on random prefix-cache schedules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import Request, SamplingParams
from andante.kv import KVBlockManager
from tests.kv.test_prefix_cache_properties import OPS, _World


def _plain_refuses(kv: KVBlockManager, rid: str, total: int) -> bool:
    if rid in kv._host_tables:
        return not kv.can_swap_in(rid, kv.num_new_blocks_needed(rid, total))
    return kv.hit_is_settled(rid) and not kv.can_allocate(rid, total)


@settings(max_examples=300, deadline=None)
@given(
    ops=OPS,
    num_device=st.integers(min_value=4, max_value=24),
    num_host=st.integers(min_value=0, max_value=16),
    block_size=st.sampled_from([1, 2, 4]),
    watermark=st.sampled_from([0.0, 0.1, 0.25]),
)
def test_the_fused_refusal_is_its_definition(ops: list[tuple[str, int, int]],
                                             num_device: int, num_host: int,
                                             block_size: int, watermark: float) -> None:
    kv = KVBlockManager(block_size, num_device, num_host, watermark=watermark)
    world = _World(kv)
    for op, index, n in ops:
        world.apply(op, f"r{index}", n)
        for rid, req in world.requests.items():
            for total in range(1, req.num_tokens + 2 * block_size * n):
                assert kv.refuses_for_now(rid, total) == _plain_refuses(kv, rid, total)


def test_a_hit_on_evictable_blocks_counts_them_as_taken() -> None:
    """A tentative hit on cached, free blocks takes them from the free ones when
    admitted: 8 hit blocks (evictable) and 3 more of 10 free do not fit."""
    kv = KVBlockManager(block_size=1, num_device_blocks=10, num_host_blocks=0, watermark=0.0)
    a = Request("a", list(range(1, 9)), SamplingParams(max_tokens=4), 0.0)
    kv.track(a)
    assert kv.allocate_slots("a", 8) is not None
    a.num_computed_tokens = 8
    kv.cache_computed([a])
    kv.free("a")  # its 8 blocks stay cached, evictable
    b = Request("b", [*range(1, 9), 50], SamplingParams(max_tokens=4), 0.0)
    kv.track(b)
    assert "b" in kv.take_due_lookups()  # (the scheduler's step: due, looked up)
    b.num_computed_tokens = kv.lookup_prefix(b)
    assert b.num_computed_tokens == 8 and kv.num_free_device_blocks == 10
    for total in range(9, 14):
        assert kv.refuses_for_now("b", total) == _plain_refuses(kv, "b", total)
    assert not kv.refuses_for_now("b", 10)  # 2 new + 8 hit blocks: 10 of 10
    assert kv.refuses_for_now("b", 11)
