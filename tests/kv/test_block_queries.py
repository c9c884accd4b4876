"""The block manager's figures that policies ask instead of redoing block and watermark
arithmetic (DESIGN.md §2.6): each against the definition it stands for."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from andante.kv import KVBlockManager
from andante.kv.block_manager import max_new_blocks_for, num_blocks_for


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_blocks_for_tokens_is_the_ceiling(num_tokens: int, block_size: int) -> None:
    kv = KVBlockManager(block_size=block_size, num_device_blocks=8)
    assert num_blocks_for(num_tokens, block_size) == math.ceil(num_tokens / block_size)
    assert kv.num_blocks_for(num_tokens) == num_blocks_for(num_tokens, block_size)
    assert kv.num_slots_in(kv.num_blocks_for(num_tokens)) >= num_tokens


@given(st.lists(st.integers(1, 100_000), min_size=1, max_size=20), st.integers(1, 64))
def test_blocks_for_an_array_of_token_counts_is_elementwise(counts: list[int],
                                                            block_size: int) -> None:
    tokens = np.array(counts, dtype=float)
    kv = KVBlockManager(block_size=block_size, num_device_blocks=8)
    blocks = kv.num_blocks_for(tokens)
    assert blocks.tolist() == np.ceil(tokens / block_size).tolist()
    assert kv.num_slots_in(blocks).tolist() == (blocks * block_size).tolist()


@given(st.integers(0, 200), st.integers(0, 300), st.integers(1, 16))
def test_max_new_blocks_bounds_any_append(held_tokens: int, num_tokens: int,
                                          block_size: int) -> None:
    kv = KVBlockManager(block_size=block_size, num_device_blocks=10_000, watermark=0.0)
    if held_tokens:
        kv.allocate("a", held_tokens)
    need = kv.num_new_blocks_needed("a", held_tokens + num_tokens)
    assert need <= kv.max_new_blocks_for(num_tokens) == max_new_blocks_for(num_tokens,
                                                                            block_size)


def test_watermark_figures() -> None:
    kv = KVBlockManager(block_size=4, num_device_blocks=100, watermark=0.05)
    assert kv.watermark_blocks == 5
    assert kv.num_blocks_above_watermark == 95
    kv.allocate("a", 4 * 97)
    assert kv.num_free_device_blocks == 3
    assert kv.num_free_blocks_above_watermark == -2  # below the watermark


@given(st.integers(1, 500), st.floats(0.0, 1.0))
def test_free_blocks_below_a_usage_keep_it_below(num_blocks: int, usage: float) -> None:
    kv = KVBlockManager(block_size=1, num_device_blocks=num_blocks, watermark=0.0)
    free = kv.min_free_blocks_below_usage(usage)
    if free <= num_blocks:  # (reachable)
        kv.allocate("a", num_blocks - free)
        assert kv.usage < usage


@given(st.integers(0, 40), st.integers(1, 80), st.sampled_from([0.0, 0.1, 0.25]))
def test_blocks_short_is_zero_exactly_when_it_can_allocate(held: int, more: int,
                                                           watermark: float) -> None:
    kv = KVBlockManager(block_size=4, num_device_blocks=20, watermark=watermark,
                        enable_prefix_caching=False)
    kv.allocate("other", 4 * 10)  # half the device in use
    if held:
        kv.allocate("a", held)
    total = held + more
    short = kv.num_blocks_short("a", total)
    assert (short == 0) == kv.can_allocate("a", total)
    if short:  # freeing that many blocks would make it fit
        kv.free("other")
        freed = 10
        assert short > 0 and (short <= freed) == kv.can_allocate("a", total)
