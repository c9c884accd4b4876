"""Differential property test: `PrefixCache` (per-block state in lists, the evictable
LRU in release segments with lazy deletion) answers every call exactly as the plain
per-block implementation it replaced (dicts and an OrderedDict, kept here as the
reference), on random runs of lookups, shares, registrations, releases, evictions,
moves and resizes (a shrink evicting the blocks it drops first), with the LRU's
compaction forced often."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.kv import lru
from andante.kv.lru import SegmentLRU
from andante.kv.prefix_cache import PrefixCache

NUM_BLOCKS = 24


class ReferenceCache:
    """The per-block prefix cache as it was: hash <-> block dicts, counts, LRU dict."""

    def __init__(self) -> None:
        self.block_of: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.evicted: list[int] = []

    def longest_prefix(self, hashes: list[int], max_blocks: int) -> list[int]:
        blocks = []
        for h in hashes[:max_blocks]:
            if h not in self.block_of:
                break
            blocks.append(self.block_of[h])
        return blocks

    def count_evictable(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if b in self.evictable)

    def share(self, blocks: list[int]) -> None:
        for b in blocks:
            if b in self.evictable:
                del self.evictable[b]
                self.refs[b] = 1
            else:
                self.refs[b] += 1

    def register_run(self, table: list[int], hashes: list[int], start: int,
                     stop: int) -> list[int]:
        new = []
        for j in range(start, stop):
            if hashes[j] not in self.block_of:
                self.block_of[hashes[j]] = table[j]
                self.hash_of[table[j]] = hashes[j]
                self.refs[table[j]] = 1
                new.append(hashes[j])
        return new

    def release(self, blocks: list[int], keep_cached: bool) -> list[int]:
        plain = []
        for b in reversed(blocks):
            if b not in self.hash_of:
                plain.append(b)
                continue
            self.refs[b] -= 1
            if self.refs[b]:
                continue
            del self.refs[b]
            if keep_cached:
                self.evictable[b] = None
            else:
                self._unregister(b)
                plain.append(b)
        plain.reverse()
        return plain

    def evict_lru(self, num: int) -> list[int]:
        taken = [self.evictable.popitem(last=False)[0] for _ in range(num)]
        for b in taken:
            del self.block_of[self.hash_of.pop(b)]
        self.evicted.extend(taken)
        return taken

    def evict(self, block: int) -> None:
        del self.evictable[block]
        self._unregister(block)

    def _unregister(self, block: int) -> None:
        del self.block_of[self.hash_of.pop(block)]
        self.evicted.append(block)

    def move(self, old: int, new: int) -> None:
        block_hash = self.hash_of.pop(old)
        self.hash_of[new] = block_hash
        self.block_of[block_hash] = new
        self.refs[new] = self.refs.pop(old)

    # (no `resize`: dicts cover every block id)


def _chain(tokens: list[int]) -> list[int]:
    """Chained block hashes of a run of one-token blocks (small alphabet: shared
    prefixes, hence hits and duplicates, are common)."""
    hashes, parent = [], 0
    for t in tokens:
        parent = hash((parent, t))
        hashes.append(parent)
    return hashes


OPS = st.lists(st.tuples(st.sampled_from(["admit", "admit", "release", "drop", "evict",
                                          "evict_one", "move", "shrink", "grow"]),
                         st.lists(st.integers(0, 2), min_size=1, max_size=8),
                         st.integers(0, 50)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_prefix_cache_matches_the_per_block_reference(ops: list[tuple[str, list[int], int]],
                                                      ) -> None:
    slack = lru.COMPACT_SLACK
    lru.COMPACT_SLACK = 0  # compact as soon as stale entries outnumber live ones
    try:
        _run(ops)
    finally:
        lru.COMPACT_SLACK = slack


def _run(ops: list[tuple[str, list[int], int]]) -> None:
    new, ref = PrefixCache(NUM_BLOCKS), ReferenceCache()
    free = list(range(NUM_BLOCKS))  # never-registered free blocks
    tables: list[list[int]] = []
    size = NUM_BLOCKS  # the tier's block ids: [0, size)
    for op, tokens, n in ops:
        if op in ("move", "shrink", "grow"):
            free, size = _resize_op(op, n, new, ref, tables, free, size)
            _same(new, ref, tables)
            continue
        if op == "admit":
            hashes = _chain(tokens)
            hit = ref.longest_prefix(hashes, len(hashes))
            assert new.longest_prefix(hashes, len(hashes)) == hit
            assert new.count_evictable(hit) == ref.count_evictable(hit)
            need = len(hashes) - len(hit)
            room = len(free) + len(ref.evictable) - ref.count_evictable(hit)
            if need > room:
                continue
            new.share(hit)
            ref.share(hit)
            short = need - len(free)
            if short > 0:
                assert new.evict_lru(short) == (gone := ref.evict_lru(short))
                free += gone
            table = hit + [free.pop() for _ in range(need)]
            assert new.register_run(table, hashes, len(hit), len(table)) == \
                ref.register_run(table, hashes, len(hit), len(table))
            tables.append(table)
        elif op in ("release", "drop") and tables:
            table = tables.pop(n % len(tables))
            plain = ref.release(table, op == "release")
            assert new.release(table, op == "release") == plain
            free += plain
        elif op == "evict" and ref.evictable:
            num = 1 + n % len(ref.evictable)
            assert new.evict_lru(num) == (gone := ref.evict_lru(num))
            free += gone
        elif op == "evict_one" and ref.evictable:
            block = list(ref.evictable)[n % len(ref.evictable)]
            new.evict(block)
            ref.evict(block)
            free.append(block)
        _same(new, ref, tables)


def _resize_op(op: str, n: int, new: PrefixCache, ref: ReferenceCache,
               tables: list[list[int]], free: list[int], size: int
               ) -> tuple[list[int], int]:
    """`move`: a registered block in use moves to a free id; `shrink`: the tier drops
    the ids from `to` on (as the block manager shrinks it: the evictable blocks there
    are evicted, the ones in use move below `to`, then `resize`); `grow`: back to
    NUM_BLOCKS. Returns the free list and the size after."""
    if op == "grow":
        new.resize(NUM_BLOCKS)
        return free + list(range(size, NUM_BLOCKS)), NUM_BLOCKS
    if op == "move":
        if ref.refs and free:
            old = sorted(ref.refs)[n % len(ref.refs)]
            target = free.pop(n % len(free))
            new.move(old, target)
            ref.move(old, target)
            _relocate(tables, old, target)
            free.append(old)
        return free, size
    to = 4 + n % max(1, size - 4)
    high = sorted({b for table in tables for b in table if b >= to})
    low_free = [b for b in free if b < to]
    if to >= size or len(high) > len(low_free):
        return free, size
    for block in [b for b in ref.evictable if b >= to]:  # evict, then resize
        new.evict(block)
        ref.evict(block)
    for old in high:
        target = low_free.pop()
        if old in ref.hash_of:
            new.move(old, target)
            ref.move(old, target)
        _relocate(tables, old, target)
    new.resize(to)
    return low_free, to


def _relocate(tables: list[list[int]], old: int, new: int) -> None:
    for table in tables:
        table[:] = [new if b == old else b for b in table]


def _same(new: PrefixCache, ref: ReferenceCache, tables: list[list[int]]) -> None:
    assert list(new.evictable) == list(ref.evictable)  # the same LRU order
    assert new.num_evictable == len(ref.evictable)
    assert new.block_of == ref.block_of and new.hash_of == ref.hash_of
    assert new.refs == ref.refs and new.evicted == ref.evicted
    counts: dict[int, int] = {}
    for table in tables:
        for b in table:
            counts[b] = counts.get(b, 0) + 1
    new.check(counts)


def test_segment_lru_takes_the_oldest_live_blocks_past_stale_entries() -> None:
    state = [0] * 10
    order = SegmentLRU(state)
    order.push([3, 1, 4])
    order.push([5, 9])
    state[1] = 1  # block 1 taken back by a prefix hit: its entry goes stale
    order.num -= 1
    order.push([1, 2])  # released again: now the newest
    assert list(order) == [3, 4, 5, 9, 1, 2] and len(order) == 6
    assert order.pop_oldest(3) == [3, 4, 5]
    assert [state[b] for b in (3, 4, 5)] == [0, 0, 0]
    assert list(order) == [9, 1, 2]
    order.compact()
    assert list(order) == [9, 1, 2]
    order.check()
    with pytest.raises(KeyError):
        order.pop_oldest(4)


def test_segments_stay_proportional_to_the_evictable_blocks() -> None:
    """A block shared again and again leaves a stale entry per release; compaction
    bounds them (no growth with the number of requests)."""
    cache = PrefixCache(4)
    cache.register_run([0, 1], [11, 12], 0, 2)
    for _ in range(20_000):
        cache.release([0, 1])
        cache.share(cache.longest_prefix([11, 12], 2))
    cache.release([0, 1])
    assert list(cache.evictable) == [1, 0]
    assert cache.evictable.num_entries <= 2 * 2 + lru.COMPACT_SLACK
