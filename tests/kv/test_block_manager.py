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
    assert kv.num_free_host_blocks == 1 and kv.holds_host_blocks("a")
    back = kv.swap_in("a")
    assert [h for h, _ in back] == [h for _, h in out]
    assert kv.num_free_host_blocks == 4 and kv.num_device_blocks_of("a") == 3
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
    assert kv.can_allocate(90) and not kv.can_allocate(91)
    kv.allocate("a", 90)
    kv.append_slots("a", 100)  # running requests may dip into the watermark
    assert kv.num_free_device_blocks == 0


def test_double_allocate_and_bad_sizes_are_refused() -> None:
    kv = KVBlockManager(block_size=2, num_device_blocks=4)
    kv.allocate("a", 2)
    with pytest.raises(ValueError, match="already holds"):
        kv.allocate("a", 2)
    with pytest.raises(ValueError, match="block_size"):
        KVBlockManager(block_size=0, num_device_blocks=4)
    with pytest.raises(OutOfBlocksError):
        kv.allocate("b", 100)


def test_resize_grows_and_refuses_to_shrink_under_used_blocks() -> None:
    kv = KVBlockManager(block_size=1, num_device_blocks=4, watermark=0.0)
    kv.allocate("a", 4)
    kv.resize_device(6)
    assert kv.num_free_device_blocks == 2
    with pytest.raises(OutOfBlocksError):
        kv.resize_device(3)
    kv.resize_device(4)
    kv.check_invariants()
