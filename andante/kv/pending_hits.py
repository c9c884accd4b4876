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

from dataclasses import dataclass

from andante.kv.prefix_cache import PrefixCache


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
        self._holders: dict[int, set[str]] = {}  # block -> requests whose hit holds it
        self._waiting_on: dict[int, set[str]] = {}  # hash -> requests it would extend
        self.dirty: set[str] = set()  # requests to look up again

    def record(self, request_id: str, blocks: list[int], next_hash: int | None) -> None:
        """The request's hit is now `blocks` (a fresh lookup)."""
        self.pop(request_id)
        self.hits[request_id] = PendingHit(blocks, next_hash)
        holders = self._holders
        for block in blocks:
            held = holders.get(block)
            if held is None:
                holders[block] = {request_id}
            else:
                held.add(request_id)
        if next_hash is not None:
            self._waiting_on.setdefault(next_hash, set()).add(request_id)

    def pop(self, request_id: str) -> PendingHit | None:
        """Forget the request's hit (admitted, or gone); returns it."""
        hit = self.hits.pop(request_id, None)
        if hit is None:
            return None
        for block in hit.blocks:
            holders = self._holders.get(block)
            if holders is not None:
                holders.discard(request_id)
                if not holders:
                    del self._holders[block]
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
        for block in evicted:
            for request_id in self._holders.pop(block, ()):
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
            if hit.valid and any(request_id not in self._holders.get(b, ()) for b in hit.blocks):
                raise AssertionError(f"pending hit of {request_id!r} not indexed")
