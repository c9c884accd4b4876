"""Prefix caching in the block manager: chained hashes, sharing with reference counts,
cached free blocks evicted LRU, the swap rule and resizing with cached blocks."""

from __future__ import annotations

import pytest

from andante.core import Request, SamplingParams, SyntheticTokens
from andante.core.request import PrefixIds
from andante.kv import KVBlockManager
from andante.kv.prefix_cache import PrefixCache, RequestHashes

B = 4  # block size


def _req(rid: str, tokens: list[int], model: str = "") -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=8), 0.0, model=model)


def _admit(kv: KVBlockManager, req: Request, num_new: int | None = None) -> int:
    """Track, look up and allocate like the scheduler; returns the hit in tokens."""
    kv.track(req)
    hit = kv.lookup_prefix(req)
    req.num_computed_tokens = hit
    total = req.num_tokens if num_new is None else hit + num_new
    assert kv.allocate_slots(req.request_id, total) is not None
    return hit


def _compute(kv: KVBlockManager, req: Request, upto: int | None = None) -> None:
    """The step computed the request's tokens up to `upto` (default: all)."""
    req.num_computed_tokens = req.num_tokens if upto is None else upto
    kv.cache_computed([req])


def _finish(kv: KVBlockManager, req: Request) -> None:
    kv.free(req.request_id)
    kv.forget(req.request_id)


def test_hashes_are_chained_from_the_prefix_and_the_model() -> None:
    a = RequestHashes(_req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]), B).upto(10)
    b = RequestHashes(_req("b", [1, 2, 3, 4, 5, 6, 7, 8]), B).upto(10)
    c = RequestHashes(_req("c", [0, 2, 3, 4, 5, 6, 7, 8]), B).upto(10)
    other_model = RequestHashes(_req("d", [1, 2, 3, 4], model="m2"), B).upto(10)
    assert len(a) == 2 and a == b  # full blocks only
    assert c[1] != a[1]  # same block content, other prefix
    assert other_model[0] != a[0]


def test_hashes_cover_output_tokens_and_content_ids() -> None:
    req = _req("a", [1, 2, 3, 4, 5, 6])
    hashes = RequestHashes(req, B)
    assert len(hashes.upto(5)) == 1
    req.append_output_token(7, 0.1)
    req.append_output_token(8, 0.2)
    assert hashes.upto(5) == RequestHashes(_req("b", [1, 2, 3, 4, 5, 6, 7, 8]), B).upto(5)
    synthetic = Request("s", SyntheticTokens(8), SamplingParams(max_tokens=1), 0.0)
    twin = Request("s2", SyntheticTokens(8), SamplingParams(max_tokens=1), 0.0)
    own = RequestHashes(synthetic, B).upto(2)
    assert len(own) == 2 and not set(own) & set(RequestHashes(twin, B).upto(2))
    with_ids = Request("t", SyntheticTokens(8), SamplingParams(max_tokens=1), 0.0,
                       prefix_ids=PrefixIds((5, 6, 7), 4, 10))
    same_start = Request("u", SyntheticTokens(8), SamplingParams(max_tokens=1), 0.0,
                         prefix_ids=PrefixIds((5, 9), 4, 8))
    ids_a, ids_b = RequestHashes(with_ids, 2).upto(9), RequestHashes(same_start, 2).upto(9)
    assert len(ids_a) == 5 and len(ids_b) == 4  # 10 and 8 tokens of 2-token blocks
    assert ids_a[:2] == ids_b[:2] and ids_a[2] != ids_b[2]


def test_second_request_shares_the_cached_prefix_and_computes_the_rest() -> None:
    kv = KVBlockManager(B, 16, watermark=0.0)
    a = _req("a", list(range(10)))
    assert _admit(kv, a) == 0
    _compute(kv, a)
    b = _req("b", list(range(9)) + [99, 98])
    assert _admit(kv, b) == 8  # two full blocks; the third differs
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2]
    assert kv.block_table("b")[2] != kv.block_table("a")[2]
    assert kv.num_free_device_blocks == 16 - 3 - 1  # a shared block counts once
    kv.check_invariants()


def test_never_the_whole_prompt_is_cached() -> None:
    kv = KVBlockManager(B, 16, watermark=0.0)
    a = _req("a", list(range(8)))
    _admit(kv, a)
    _compute(kv, a)
    b = _req("b", list(range(8)))  # identical prompt: 2 full blocks
    assert _admit(kv, b) == 4  # at least one token computed, for its logits
    kv.check_invariants()


def test_freed_blocks_stay_cached_and_are_evicted_lru_only_when_needed() -> None:
    kv = KVBlockManager(B, 6, watermark=0.0)
    a, b = _req("a", [1] * 9), _req("b", [2] * 9)
    for req in (a, b):
        _admit(kv, req)
        _compute(kv, req)
    _finish(kv, a)  # its 2 full blocks stay cached
    _finish(kv, b)
    assert kv.num_free_device_blocks == 6 and kv.num_cached_free_blocks == 4
    c = _req("c", [3] * 8)
    _admit(kv, c)  # takes the 2 never-cached blocks first
    assert kv.num_cached_free_blocks == 4
    d = _req("d", [4] * 3)
    _admit(kv, d)  # now evicts the least recently released: a's deeper block
    assert kv.num_cached_free_blocks == 3
    _finish(kv, c)
    _finish(kv, d)
    again_a, again_b = _req("a2", [1] * 9), _req("b2", [2] * 9)
    assert _admit(kv, again_b) == 8  # b's blocks survived
    assert _admit(kv, again_a) == 4  # a's first block survived, its second did not
    kv.check_invariants()


def test_reference_counts_follow_every_holder() -> None:
    kv = KVBlockManager(B, 16, watermark=0.0)
    owner = _req("a", list(range(13)))
    _admit(kv, owner)
    _compute(kv, owner)
    readers = [_req(f"r{i}", list(range(12)) + [50 + i]) for i in range(3)]
    for reader in readers:
        assert _admit(kv, reader) == 12
    shared = kv.block_table("a")[0]
    assert kv.cache.refs[shared] == 4
    _finish(kv, owner)
    _finish(kv, readers[0])
    assert kv.cache.refs[shared] == 2 and kv.num_cached_free_blocks == 0
    for reader in readers[1:]:
        _finish(kv, reader)
    assert kv.num_cached_free_blocks == 3 and kv.num_free_device_blocks == 16
    kv.check_invariants()


def test_admission_counts_free_cached_blocks_it_takes_against_the_watermark() -> None:
    kv = KVBlockManager(B, 10, watermark=0.2)  # 2 blocks of watermark
    a = _req("a", list(range(25)))
    _admit(kv, a)
    _compute(kv, a)
    _finish(kv, a)  # 6 cached free blocks, 4 never cached
    b = _req("b", list(range(24)) + [77, 78, 79, 80, 81, 82, 83, 84])
    kv.track(b)
    b.num_computed_tokens = kv.lookup_prefix(b)
    assert b.num_computed_tokens == 24
    # 6 shared (taken from the free ones) + 2 new = 8 <= 10 - 2
    assert kv.num_new_blocks_needed("b", b.num_tokens) == 8
    assert kv.can_allocate("b", b.num_tokens)
    assert kv.max_num_tokens_for("b") == (6 + 10 - 2 - 6) * B
    kv.allocate_slots("b", b.num_tokens)
    assert kv.num_free_device_blocks == 2
    kv.check_invariants()


def test_a_hit_evicted_before_admission_is_refused_until_looked_up_again() -> None:
    kv = KVBlockManager(B, 4, watermark=0.0)
    a = _req("a", list(range(9)))
    _admit(kv, a)
    _compute(kv, a)
    _finish(kv, a)
    b = _req("b", list(range(9)))
    kv.track(b)
    b.num_computed_tokens = kv.lookup_prefix(b)
    assert b.num_computed_tokens == 8
    kv.allocate_slots("x", 16)  # evicts the cached blocks
    assert not kv.can_allocate("b", b.num_tokens)
    assert kv.max_num_tokens_for("b") == 0
    assert kv.allocate_slots("b", b.num_tokens) is None
    kv.free("x")
    assert kv.lookup_prefix(b) == 0  # a fresh lookup
    kv.check_invariants()


def test_swap_out_keeps_shared_blocks_with_their_other_holders() -> None:
    kv = KVBlockManager(B, 16, num_host_blocks=8, watermark=0.0)
    a = _req("a", list(range(13)))
    _admit(kv, a)
    _compute(kv, a)
    b = _req("b", list(range(12)) + [40])
    _admit(kv, b)
    pairs = kv.swap_out("b")
    assert len(pairs) == 4  # every block copied, shared ones too
    assert all(kv.cache.refs[blk] == 1 for blk in kv.block_table("a")[:3])
    _compute(kv, a)
    kv.swap_in("b")
    kv.end_step()
    assert set(kv.block_table("b")).isdisjoint(kv.block_table("a"))  # private copies
    kv.check_invariants()
    _finish(kv, a)
    _finish(kv, b)
    kv.check_invariants()
    assert kv.num_free_device_blocks == 16 and kv.num_free_host_blocks == 8


def test_a_swapped_out_block_held_by_no_one_else_leaves_the_cache() -> None:
    kv = KVBlockManager(B, 8, num_host_blocks=8, watermark=0.0)
    a = _req("a", list(range(9)))
    _admit(kv, a)
    _compute(kv, a)
    kv.swap_out("a")
    assert kv.num_cached_free_blocks == 0 and not kv.cache.block_of
    kv.check_invariants()


def test_shrinking_evicts_cached_free_blocks_and_moves_shared_ones_once() -> None:
    kv = KVBlockManager(B, 12, watermark=0.0)
    filler = _req("f", [9] * 16)
    _admit(kv, filler)  # blocks 0-3
    owner = _req("a", list(range(9)))
    _admit(kv, owner)  # blocks 4-6
    _compute(kv, owner)
    reader = _req("b", list(range(8)) + [70])
    assert _admit(kv, reader) == 8  # shares 4, 5; own block 7
    old = _req("c", [5] * 9)
    _admit(kv, old)  # blocks 8-10
    _compute(kv, old)
    _finish(kv, old)  # cached free: 8, 9
    _finish(kv, filler)
    moved = kv.resize_device(6)
    assert moved is not None and kv.num_device_blocks == 6
    assert kv.num_cached_free_blocks == 0  # the cached free blocks above 6 were evicted
    assert kv.block_table("a")[:2] == kv.block_table("b")[:2]
    assert max(kv.block_table("a") + kv.block_table("b")) < 6
    kv.check_invariants()
    assert kv.resize_device(3) is None  # 4 blocks in use


def test_prefix_caching_off_tracks_nothing() -> None:
    kv = KVBlockManager(B, 8, watermark=0.0, enable_prefix_caching=False)
    a = _req("a", list(range(9)))
    assert not kv.track(a)
    kv.allocate_slots("a", 9)
    a.num_computed_tokens = 9
    kv.cache_computed([a])
    kv.free("a")
    b = _req("b", list(range(9)))
    assert kv.lookup_prefix(b) == 0 and kv.num_cached_free_blocks == 0


@pytest.mark.parametrize("bad", [0, -1])
def test_prefix_ids_are_checked(bad: int) -> None:
    with pytest.raises(ValueError):
        PrefixIds((1, 2), bad, 2)
    with pytest.raises(ValueError):
        PrefixIds((1, 2), 4, 9)


def _synthetic(rid: str, num_tokens: int, ids: PrefixIds | None = None) -> Request:
    return Request(rid, SyntheticTokens(num_tokens), SamplingParams(max_tokens=4), 0.0,
                   prefix_ids=ids)


def test_a_simulated_prompt_preempted_by_recompute_finds_its_own_blocks_again() -> None:
    kv = KVBlockManager(B, 16, watermark=0.0)
    a = _synthetic("a", 10)
    assert _admit(kv, a) == 0
    _compute(kv, a)
    assert kv.cache.num_evictable == 0 and not kv.cache.block_of  # nothing registered yet
    kv.free("a", resumes=True)  # preempted by recompute: vLLM v1 keeps the blocks cached
    a.num_computed_tokens = 0
    assert kv.num_cached_free_blocks == 2
    assert _admit(kv, a) == 8
    other = _synthetic("b", 10)  # same length, other content: no hit
    assert _admit(kv, other) == 0
    kv.check_invariants()


def test_a_finished_simulated_prompt_leaves_only_its_shareable_blocks_cached() -> None:
    kv = KVBlockManager(B, 16, watermark=0.0)
    a = _synthetic("a", 13, PrefixIds((1, 2), 4, 8))  # 8 shared tokens, 5 of its own
    _admit(kv, a)
    _compute(kv, a)
    kv.free("a", resumes=True)
    a.num_computed_tokens = 0
    assert _admit(kv, a) == 12  # all its full blocks
    _compute(kv, a)
    _finish(kv, a)
    assert kv.num_cached_free_blocks == 2  # the two blocks its ids describe
    b = _synthetic("b", 13, PrefixIds((1, 2), 4, 8))
    assert _admit(kv, b) == 8
    kv.check_invariants()


def test_a_misused_cache_fails_fast() -> None:
    """Sharing a block no hash names, or releasing an evictable one (no table holds
    it), raises instead of making up a count or queueing the block twice."""
    cache = PrefixCache(4)
    cache.register_run([0, 1], [11, 12], 0, 2)
    with pytest.raises(KeyError):
        cache.share([2])  # not registered
    assert not cache.is_registered(2) and cache.refs == {0: 1, 1: 1}
    cache.release([0, 1])
    assert list(cache.evictable) == [1, 0] and cache.num_evictable == 2
    with pytest.raises(KeyError):
        cache.release([1])  # evictable: released twice
    assert list(cache.evictable) == [1, 0] and cache.num_evictable == 2
    cache.check({})
