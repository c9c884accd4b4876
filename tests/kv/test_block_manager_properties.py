"""Property test: random allocate/append/swap/free sequences through the block manager's
one rule set (`allocate_slots`, `can_swap_out`/`swap_out`, `can_swap_in`/`swap_in`,
`end_step`, `resize_device`) conserve blocks and keep the admission watermark."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.kv import KVBlockManager, OutOfBlocksError

OPS = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "append", "swap_out", "swap_in", "free", "end_step",
                         "resize"]),
        st.integers(min_value=0, max_value=7),  # which request
        st.integers(min_value=1, max_value=40),  # how many tokens
    ),
    max_size=120,
)


def _host_blocks(kv: KVBlockManager, rid: str) -> int:
    return kv.num_blocks_of(rid) - kv.num_device_blocks_of(rid)  # one tier at a time


def _allocate(kv: KVBlockManager, tokens: dict[str, int], rid: str, target: int) -> None:
    admission = not kv.holds_kv(rid)
    free_before = kv.num_free_device_blocks
    new = kv.allocate_slots(rid, target)
    if new is None:
        assert kv.num_free_device_blocks == free_before  # a refusal allocates nothing
        return
    if admission:
        assert kv.num_free_device_blocks >= kv.watermark_blocks
    tokens[rid] = target


def _swap_out(kv: KVBlockManager, rid: str) -> None:
    if kv.can_swap_out(rid):
        pairs = kv.swap_out(rid)
        assert len(pairs) == _host_blocks(kv, rid)
        return
    try:
        kv.swap_out(rid)
    except OutOfBlocksError:
        assert kv.num_device_blocks_of(rid)  # a failed swap keeps the table
    else:
        raise AssertionError("swap_out should have failed")


def _apply(kv: KVBlockManager, tokens: dict[str, int], op: str, rid: str, n: int) -> None:
    on_device = kv.holds_kv(rid) and not _host_blocks(kv, rid)
    if op == "allocate" and rid not in tokens:
        _allocate(kv, tokens, rid, n)
    elif op == "append" and on_device:
        _allocate(kv, tokens, rid, tokens[rid] + n)
    elif op == "swap_out" and on_device:
        _swap_out(kv, rid)
    elif op == "swap_in" and kv.can_swap_in(rid):
        kv.swap_in(rid)
    elif op == "free" and rid in tokens:
        kv.free(rid)
        del tokens[rid]
    elif op == "end_step":
        kv.end_step()
    elif op == "resize":
        _resize(kv, n)


def _resize(kv: KVBlockManager, n: int) -> None:
    """Grow or shrink the device tier (KunServe); a shrink keeps every table's content."""
    target = max(1, n // 2)
    before = {r: list(kv.block_table(r)) for r in list(kv._device_tables)}
    used = kv.device.num_used
    moved = kv.resize_device(target)
    if moved is None:
        assert used > target and kv.num_device_blocks != target
        return
    assert kv.num_device_blocks == target
    for rid, table in before.items():
        assert kv.block_table(rid) == [moved.get(b, b) for b in table]


@settings(max_examples=300, deadline=None)
@given(
    ops=OPS,
    num_device=st.integers(min_value=1, max_value=24),
    num_host=st.integers(min_value=0, max_value=24),
    block_size=st.sampled_from([1, 4, 16]),
    watermark=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_random_sequences_conserve_blocks(
    ops: list[tuple[str, int, int]], num_device: int, num_host: int, block_size: int,
    watermark: float,
) -> None:
    kv = KVBlockManager(block_size, num_device, num_host, watermark=watermark)
    tokens: dict[str, int] = {}
    for op, index, n in ops:
        _apply(kv, tokens, op, f"r{index}", n)
        kv.check_invariants()
        assert kv.num_free_device_blocks + sum(
            kv.num_device_blocks_of(r) for r in tokens
        ) == kv.num_device_blocks
        for rid, count in tokens.items():
            assert kv.num_blocks_of(rid) == kv.num_blocks_for(count)
    kv.end_step()
    assert kv.num_free_host_blocks + sum(_host_blocks(kv, r) for r in tokens) == num_host
    for rid in list(tokens):
        kv.free(rid)
    kv.check_invariants()
    assert kv.num_free_device_blocks == kv.num_device_blocks
    assert kv.num_free_host_blocks == num_host
