"""Property test: random allocate/append/swap/free sequences conserve blocks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.kv import KVBlockManager, OutOfBlocksError

OPS = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "append", "swap_out", "swap_in", "free"]),
        st.integers(min_value=0, max_value=7),  # which request
        st.integers(min_value=1, max_value=40),  # how many tokens
    ),
    max_size=120,
)


def _apply(kv: KVBlockManager, tokens: dict[str, int], op: str, rid: str, n: int) -> None:
    if op == "allocate" and rid not in tokens:
        if kv.can_allocate(kv.num_blocks_for(n)):
            kv.allocate(rid, n)
            tokens[rid] = n
    elif op == "append" and kv.holds_device_blocks(rid):
        target = tokens[rid] + n
        if kv.num_new_blocks_needed(rid, target) <= kv.num_free_device_blocks:
            kv.append_slots(rid, target)
            tokens[rid] = target
    elif op == "swap_out" and kv.holds_device_blocks(rid):
        if kv.can_swap_out(rid):
            pairs = kv.swap_out(rid)
            assert len(pairs) == kv.num_host_blocks_of(rid)
        else:
            try:
                kv.swap_out(rid)
            except OutOfBlocksError:
                assert kv.holds_device_blocks(rid)  # failed swap keeps the table
            else:
                raise AssertionError("swap_out should have failed")
    elif op == "swap_in" and kv.holds_host_blocks(rid) and kv.can_swap_in(rid):
        kv.swap_in(rid)
    elif op == "free" and rid in tokens:
        kv.free(rid)
        del tokens[rid]


@settings(max_examples=300, deadline=None)
@given(
    ops=OPS,
    num_device=st.integers(min_value=1, max_value=24),
    num_host=st.integers(min_value=0, max_value=24),
    block_size=st.sampled_from([1, 4, 16]),
)
def test_random_sequences_conserve_blocks(
    ops: list[tuple[str, int, int]], num_device: int, num_host: int, block_size: int
) -> None:
    kv = KVBlockManager(block_size, num_device, num_host, watermark=0.0)
    tokens: dict[str, int] = {}
    for op, index, n in ops:
        _apply(kv, tokens, op, f"r{index}", n)
        kv.check_invariants()
        assert kv.num_free_device_blocks + sum(
            kv.num_device_blocks_of(r) for r in tokens
        ) == num_device
        assert kv.num_free_host_blocks + sum(kv.num_host_blocks_of(r) for r in tokens) == num_host
        for rid, count in tokens.items():
            held = kv.num_device_blocks_of(rid) or kv.num_host_blocks_of(rid)
            assert held == kv.num_blocks_for(count)
    for rid in list(tokens):
        kv.free(rid)
    kv.check_invariants()
    assert kv.num_free_device_blocks == num_device
    assert kv.num_free_host_blocks == num_host
    assert kv.owner_ids() == []
