"""Tentative prefix hits of the requests waiting for admission, kept current by events.

Design note: a waiting request starts at its cached prefix (the scheduler sets its
`num_computed_tokens` before a policy looks at it), so the hit must be known for every
waiting request at every step, yet looking each one up again at every step costs the
waiting queue times the prefix length (thousands of requests under overload). Instead,
after SGLang's radix-tree bookkeeping (a request's match changes only when a node on or
just below its path changes), a hit is looked up once and then changes only on two
events, each waking only the requests it concerns: a block of the hit is evicted (the
hit is invalid: the request cannot be admitted on it, and is looked up again), or the
block hash just after the hit is registered (the hit may grow). `dirty` holds the
requests to look up again; everything else is O(1) per request and step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from andante.kv.prefix_cache import PrefixCache

# runs an iterator (a map of C calls: a bulk update of a dict) at C speed
consume: Callable[[Iterable[Any]], None] = deque[Any](maxlen=0).extend


@dataclass(slots=True)
class PendingHit:
    """A request's cached blocks as of its last lookup; `valid` False once one of them
    was evicted; `next_hash`: the hash of the block after them (None: nothing after)."""

    blocks: list[int]
    next_hash: int | None
    valid: bool = True


class PendingHits:
    def __init__(self, cache: PrefixCache) -> None:
        self._cache = cache
        self.hits: dict[str, PendingHit] = {}
        # block -> the request whose hit holds it, or the set of them once two do
        # (a block is held by one waiting request's hit nearly always: one entry each,
        # written and erased in bulk)
        self._holders: dict[int, str | set[str]] = {}
        self._waiting_on: dict[int, set[str]] = {}  # hash -> requests it would extend
        self.dirty: set[str] = set()  # requests to look up again

    def record(self, request_id: str, blocks: list[int], next_hash: int | None) -> None:
        """The request's hit is now `blocks` (a fresh lookup)."""
        self.pop(request_id)
        self.hits[request_id] = PendingHit(blocks, next_hash)
        holders = self._holders
        if holders.keys().isdisjoint(blocks):
            holders.update(dict.fromkeys(blocks, request_id))
        else:
            for block in blocks:
                held = holders.get(block)
                if held is None:
                    holders[block] = request_id
                elif isinstance(held, str):
                    holders[block] = {held, request_id}
                else:
                    held.add(request_id)
        if next_hash is not None:
            self._waiting_on.setdefault(next_hash, set()).add(request_id)

    def pop(self, request_id: str) -> PendingHit | None:
        """Forget the request's hit (admitted, or gone); returns it."""
        hit = self.hits.pop(request_id, None)
        if hit is None:
            return None
        blocks, holders = hit.blocks, self._holders
        held_by = list(map(holders.get, blocks))
        if held_by.count(request_id) == len(held_by):  # (held by this hit alone)
            consume(map(holders.__delitem__, blocks))
        else:
            for block, held in zip(blocks, held_by, strict=True):
                if held is None:
                    continue
                if isinstance(held, str):
                    if held == request_id:
                        del holders[block]
                    continue
                held.discard(request_id)
                if not held:
                    del holders[block]
        if hit.next_hash is not None:
            waiting = self._waiting_on.get(hit.next_hash)
            if waiting is not None:
                waiting.discard(request_id)
                if not waiting:
                    del self._waiting_on[hit.next_hash]
        return hit

    def registered(self, block_hash: int) -> None:
        """A block was registered under `block_hash`: the hits it extends may grow."""
        waiting = self._waiting_on.pop(block_hash, None)
        if waiting:
            self.dirty |= waiting

    def registered_all(self, block_hashes: list[int]) -> None:
        """`registered` of each of `block_hashes`."""
        waiting_on = self._waiting_on
        if not waiting_on:
            return
        pop = waiting_on.pop
        for block_hash in block_hashes:
            waiting = pop(block_hash, None)
            if waiting:
                self.dirty |= waiting

    def drain(self) -> None:
        """Invalidate the hits holding a block evicted since the last call."""
        evicted = self._cache.evicted
        if not evicted:
            return
        self._cache.evicted = []
        holders = self._holders
        if holders.keys().isdisjoint(evicted):
            return
        for block in evicted:
            held = holders.pop(block, None)
            if held is None:
                continue
            for request_id in (held,) if isinstance(held, str) else held:
                hit = self.hits.get(request_id)
                if hit is not None:
                    hit.valid = False
                    self.dirty.add(request_id)

    def blocks_of(self, request_id: str) -> list[int] | None:
        """The request's valid hit blocks ([] if none); None if one was evicted since
        its lookup (its num_computed_tokens is stale until looked up again)."""
        self.drain()
        hit = self.hits.get(request_id)
        if hit is None:
            return []
        return hit.blocks if hit.valid else None

    def take_dirty(self) -> set[str]:
        self.drain()
        dirty, self.dirty = self.dirty, set()
        return dirty

    def check(self) -> None:
        """Raises AssertionError if the indexes disagree with the hits."""
        for request_id, hit in self.hits.items():
            for block in hit.blocks if hit.valid else ():
                held = self._holders.get(block, ())
                if held != request_id and (isinstance(held, str) or request_id not in held):
                    raise AssertionError(f"pending hit of {request_id!r} not indexed")
