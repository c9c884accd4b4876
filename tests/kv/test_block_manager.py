from __future__ import annotations

import pytest

from andante.kv import KVBlockManager, OutOfBlocksError


def test_allocate_append_and_free() -> None:
    kv = KVBlockManager(block_size=4, num_device_blocks=8, num_host_blocks=4, watermark=0.0)
    table = kv.allocate("a", 5)
    assert len(table) == 2 and kv.num_free_device_blocks == 6
    assert kv.append_slots("a", 8) == []
    assert len(kv.append_slots("a", 9)) == 1
    assert kv.usage == pytest.approx(3 / 8)
    assert kv.free("a") == 3 and kv.num_free_device_blocks == 8


def test_swap_round_trip_moves_blocks_between_tiers() -> None:
    kv = KVBlockManager(block_size=4, num_device_blocks=8, num_host_blocks=4, watermark=0.0)
    kv.allocate("a", 12)
    out = kv.swap_out("a")
    assert [d for d, _ in out] == [0, 1, 2] and kv.num_free_device_blocks == 8
    assert kv.num_free_host_blocks == 1 and kv.num_blocks_of("a") == 3
    assert kv.num_device_blocks_of("a") == 0
    back = kv.swap_in("a")
    assert [h for h, _ in back] == [h for _, h in out]
    kv.check_invariants()
    # a swap-out of the same step must not overwrite the host blocks being read
    assert kv.num_free_host_blocks == 1 and kv.num_device_blocks_of("a") == 3
    kv.end_step()
    assert kv.num_free_host_blocks == 4
    kv.check_invariants()


def test_swap_out_without_host_room_raises_and_keeps_state() -> None:
    kv = KVBlockManager(block_size=1, num_device_blocks=4, num_host_blocks=1, watermark=0.0)
    kv.allocate("a", 3)
    assert not kv.can_swap_out("a")
    with pytest.raises(OutOfBlocksError):
        kv.swap_out("a")
    assert kv.num_device_blocks_of("a") == 3
    kv.check_invariants()


def test_watermark_applies_to_admission_only() -> None:
    kv = KVBlockManager(block_size=1, num_device_blocks=100, watermark=0.1)
    assert kv.can_allocate("a", 90) and not kv.can_allocate("a", 91)
    assert kv.allocate_slots("a", 91) is None and kv.num_free_device_blocks == 100
    assert kv.allocate_slots("a", 90) is not None
    assert kv.allocate_slots("a", 100) is not None  # running requests may dip into it
    assert kv.num_free_device_blocks == 0 and kv.allocate_slots("a", 101) is None


def test_swapped_request_cannot_grow_until_swapped_in() -> None:
    kv = KVBlockManager(block_size=2, num_device_blocks=8, num_host_blocks=8, watermark=0.0)
    kv.allocate_slots("a", 4)
    kv.swap_out("a")
    assert kv.num_new_blocks_needed("a", 6) == 1  # counts the blocks it holds on the host
    assert kv.allocate_slots("a", 6) is None
    assert kv.can_swap_in("a", num_extra_blocks=6) and not kv.can_swap_in("a", 7)
    kv.swap_in("a")
    assert kv.allocate_slots("a", 6) is not None and kv.num_blocks_of("a") == 3


def test_double_allocate_and_bad_sizes_are_refused() -> None:
    kv = KVBlockManager(block_size=2, num_device_blocks=4)
    kv.allocate("a", 2)
    with pytest.raises(ValueError, match="already holds"):
        kv.allocate("a", 2)
    with pytest.raises(ValueError, match="block_size"):
        KVBlockManager(block_size=0, num_device_blocks=4)
    with pytest.raises(OutOfBlocksError):
        kv.allocate("b", 100)
