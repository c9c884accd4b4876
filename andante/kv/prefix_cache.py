"""Automatic prefix caching: content hashes of full KV blocks, reference counts, LRU.

Design note (vLLM v1's automatic prefix caching, `vllm/v1/core/kv_cache_utils.py` and
`block_pool.py`; SGLang's radix cache, RadixAttention §3): a full block's identity is a
hash chained from the request's prefix, hash(parent hash, the block's tokens), rooted
in the model, so equal hashes mean equal KV. A computed full block is *registered*
under its hash; a later request whose prompt starts with the same blocks shares them
(reference count + 1) instead of computing them again. A registered block whose count
drops to 0 keeps its KV and its hash: it is free (it counts as free for every
feasibility figure) but *evictable*, and the allocator takes it, least recently
released first, only when no never-cached free block is left (SGLang's rule: evict
only under memory pressure; vLLM's single free queue would evict it earlier).

`RequestHashes` computes a request's block hashes lazily, from its real token ids
(prompt + output), or, for a simulated prompt (`SyntheticTokens`), from its `PrefixIds`
(content that other requests may share) followed by content of its own: every other
block of a simulated request (the rest of its prompt, its output) is unique to it, as a
real prompt's would be, so vLLM v1's APC is modelled as vLLM runs it (a request
preempted by recompute finds its own freed blocks again). Blocks of its own are hashed
and registered only when the request lets go of its KV to run again (`own_blocks`):
no other request can ever hit them, so a request that is never preempted costs nothing
more than before, and on finishing they are freed uncached. `PrefixCache` is the
device tier's registry: the hash -> block map, each block's hash and count of tables in
lists indexed by block id, and the evictable blocks in LRU order (`andante.kv.lru`:
segments, one per release). The block manager owns the free list and the tables.

Cost: long prompts pass hundreds of blocks through here at each lookup, admission,
release and eviction. Per block, only the hash -> block dict is probed (inherent: the
content identity); the rest are list reads and writes, and a simulated request's chain of
hashes is computed once, in one call, not a call per block as its output fills.
"""

from __future__ import annotations

import zlib

from andante.core.request import PrefixIds, Request, SyntheticTokens
from andante.kv.lru import SegmentLRU


def root_hash(model: str) -> int:
    """The parent hash of a request's first block: its model (KV of another model's
    weights is never shared). Stable within one process only: the tuple's hash takes
    its str's, which PYTHONHASHSEED salts (the crc32 is of the model name alone)."""
    return hash(("andante-prefix", zlib.crc32(model.encode())))


def num_shareable_blocks(req: Request, block_size: int) -> int | None:
    """Full blocks of `req` that another request may hold too: None (all of them) for
    real tokens; for a simulated prompt, those its content ids describe (0 without)."""
    if not isinstance(req.prompt_token_ids, SyntheticTokens):
        return None
    ids = req.prefix_ids
    return 0 if ids is None else ids.num_tokens // block_size


class RequestHashes:
    """The chained hashes of one request's full blocks, computed as they are needed.

    `num_shareable` full blocks (None: all) may be held by other requests too and are
    registered as they are computed; the blocks after them are the request's own, and
    `num_own_cached` is the high-water mark of those it registered (`own_blocks`)."""

    __slots__ = ("_block_size", "_req", "hashes", "num_own_cached", "num_shareable")

    def __init__(self, req: Request, block_size: int) -> None:
        self._req = req
        self._block_size = block_size
        self.hashes: list[int] = []
        self.num_shareable = num_shareable_blocks(req, block_size)
        self.num_own_cached = 0

    def max_blocks(self) -> int:
        """Full blocks the request's known content covers now."""
        ids = self._req.prefix_ids
        known = self._req.num_tokens
        if ids is not None and ids.num_tokens > known:
            known = ids.num_tokens
        return known // self._block_size

    def num_computed_blocks(self) -> int:
        return self._req.num_computed_tokens // self._block_size

    def num_cacheable(self) -> int:
        """The most leading blocks that can be cached anywhere now (a lookup's limit)."""
        if self.num_shareable is None:
            return self.max_blocks()
        return max(self.num_shareable, self.num_own_cached)

    def upto(self, num_blocks: int) -> list[int]:
        """The hashes of the first `num_blocks` blocks (fewer if the content is shorter)."""
        hashes = self.hashes
        target = min(num_blocks, self.max_blocks())
        if len(hashes) < target:
            shareable = self.num_shareable
            if shareable is None:
                self._extend_from_tokens(target)
                return hashes
            ids = self._req.prefix_ids
            if ids is not None and len(hashes) < shareable:
                self._extend_from_ids(ids, min(target, shareable))
            if len(hashes) < target:
                self._extend_own(target)
        return hashes

    def chain(self, num_blocks: int) -> list[int]:
        """`upto`, but the list may hold more hashes than asked: a simulated request's
        shareable blocks are hashed all at once, on the first call (every hash is a
        function of its block's index alone, so this changes no hash; it saves a call
        per block as a request's output fills block after block)."""
        hashes = self.hashes
        if len(hashes) >= num_blocks:
            return hashes
        shareable, ids = self.num_shareable, self._req.prefix_ids
        if shareable is not None and ids is not None and len(hashes) < shareable:
            self._extend_from_ids(ids, shareable)
            if len(hashes) >= num_blocks:
                return hashes
        return self.upto(num_blocks)

    def _extend_from_tokens(self, target: int) -> None:
        req, size, hashes = self._req, self._block_size, self.hashes
        prompt, output = req.prompt_token_ids, req.output_token_ids
        num_prompt = req.num_prompt_tokens
        parent = hashes[-1] if hashes else root_hash(req.model)
        for j in range(len(hashes), target):
            start, stop = j * size, (j + 1) * size
            if stop <= num_prompt:
                tokens = tuple(prompt[start:stop])
            else:
                head = tuple(prompt[start:num_prompt]) if start < num_prompt else ()
                tokens = head + tuple(output[max(0, start - num_prompt):stop - num_prompt])
            parent = hash((parent, tokens))
            hashes.append(parent)

    def _extend_from_ids(self, ids: PrefixIds, target: int) -> None:
        size, span, hashes, content = self._block_size, ids.span_tokens, self.hashes, ids.ids
        parent = hashes[-1] if hashes else root_hash(self._req.model)
        append = hashes.append
        if span == size:  # a block per id (the default): its offset in the span is 0
            for content_id in content[len(hashes):target]:
                parent = hash((parent, 0, content_id))
                append(parent)
            return
        if span % size == 0:  # every block within one id's span
            for j in range(len(hashes), target):
                start = j * size
                first = start // span
                parent = hash((parent, start - first * span, content[first]))
                append(parent)
            return
        for j in range(len(hashes), target):
            start = j * size
            first, last = start // span, (start + size - 1) // span
            parent = hash((parent, start - first * span, content[first:last + 1]))
            append(parent)

    def _extend_own(self, target: int) -> None:
        """Blocks of the request's own content: chained from its shared prefix and
        keyed by its id, so no other request's block has their hash."""
        hashes, key = self.hashes, self._req.request_id
        parent = hashes[-1] if hashes else root_hash(self._req.model)
        for j in range(len(hashes), target):
            parent = hash((parent, key, j))
            hashes.append(parent)


class PrefixCache:
    """The registered (content-hashed) blocks of the device tier. Per-block state lives
    in lists indexed by block id (`resize` to the tier's size): a list read or write
    costs a fraction of a probe into a dict of tens of thousands of blocks, and every
    block of every prompt passes through here several times."""

    def __init__(self, num_blocks: int = 0) -> None:
        self.block_of: dict[int, int] = {}  # hash -> block
        self._hash: list[int | None] = [None] * num_blocks  # block -> hash (None: not
        # registered)
        # a registered block's tables (> 0), or -serial of its LRU segment if evictable
        # (no table holds it); 0 if not registered
        self._state: list[int] = [0] * num_blocks
        self.evictable = SegmentLRU(self._state)  # least recently released first
        self.evicted: list[int] = []  # blocks unregistered since `PendingHits.drain`

    def resize(self, num_blocks: int) -> None:
        """Cover block ids below `num_blocks`; the ones dropped must be unregistered."""
        hashes, state = self._hash, self._state
        if num_blocks >= len(state):
            hashes.extend([None] * (num_blocks - len(hashes)))
            state.extend([0] * (num_blocks - len(state)))
            return
        if any(state[num_blocks:]):
            raise ValueError(f"prefix cache: blocks >= {num_blocks} are still registered")
        self.evictable.compact()  # (no stale entry may name a dropped block)
        del hashes[num_blocks:], state[num_blocks:]

    @property
    def num_evictable(self) -> int:
        return self.evictable.num

    @property
    def hash_of(self) -> dict[int, int]:
        """Each registered block's hash (a copy, for checks)."""
        return {b: h for b, h in enumerate(self._hash) if h is not None}

    @property
    def refs(self) -> dict[int, int]:
        """Each registered block in use: its number of tables (a copy, for checks)."""
        return {b: n for b, n in enumerate(self._state) if n > 0}

    def is_registered(self, block: int) -> bool:
        return self._hash[block] is not None

    def longest_prefix(self, hashes: list[int], max_blocks: int) -> list[int]:
        """The cached blocks of the longest run of `hashes[:max_blocks]` from the start."""
        block_of, blocks = self.block_of, []
        for h in hashes[:max_blocks]:
            block = block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def count_evictable(self, blocks: list[int]) -> int:
        state = self._state
        return sum(1 for b in blocks if state[b] < 0)

    def share(self, blocks: list[int]) -> None:
        """One more table holds each of these registered blocks (KeyError for one
        that is not registered: a misuse, as a block no hash names cannot be shared)."""
        state, taken_back = self._state, 0
        for b in blocks:
            count = state[b]
            if count > 0:
                state[b] = count + 1
            elif count < 0:
                state[b] = 1
                taken_back += 1
            else:
                self.evictable.num -= taken_back
                raise KeyError(f"block {b} is not registered: it cannot be shared")
        self.evictable.num -= taken_back

    def register(self, block: int, block_hash: int) -> bool:
        """Register a full, computed block held by one table; False if another block
        already holds this content (it stays unregistered: a private duplicate)."""
        if block_hash in self.block_of:
            return False
        self.block_of[block_hash] = block
        self._hash[block] = block_hash
        self._state[block] = 1
        return True

    def register_run(self, table: list[int], hashes: list[int], start: int,
                     stop: int) -> list[int]:
        """`register` of table[j] under hashes[j] for j in [start, stop) (the hot loop of
        caching a step's computed blocks); returns the hashes newly registered."""
        block_of, hash_of, state = self.block_of, self._hash, self._state
        new: list[int] = []
        for j in range(start, stop):
            h = hashes[j]
            if h in block_of:
                continue
            b = table[j]
            block_of[h] = b
            hash_of[b] = h
            state[b] = 1
            new.append(h)
        return new

    def release(self, blocks: list[int], keep_cached: bool = True) -> list[int]:
        """One table lets go of `blocks` (in table order); returns those now free and
        unregistered (the caller frees them). Registered ones whose count drops to 0
        become evictable, the table's last block first in line (vLLM's order), or are
        unregistered and returned if not `keep_cached`. KeyError for an evictable
        block (no table holds it: released twice, it would be counted twice)."""
        state = self._state
        plain: list[int] = []
        freed: list[int] = []  # registered, held by no table now; in release order
        for b in reversed(blocks):
            count = state[b]
            if count == 0:  # not registered
                plain.append(b)
            elif count > 1:
                state[b] = count - 1
            elif count < 0:
                self.evictable.push(freed)
                raise KeyError(f"block {b} is evictable: no table holds it to release")
            elif keep_cached:
                freed.append(b)
            else:
                self._unregister(b)
                plain.append(b)
        self.evictable.push(freed)
        plain.reverse()
        return plain

    def evict_lru(self, num: int) -> list[int]:
        """Unregister the `num` least recently released evictable blocks; returns them."""
        taken = self.evictable.pop_oldest(num)
        block_of, hash_of = self.block_of, self._hash
        for b in taken:
            del block_of[hash_of[b]]  # type: ignore[arg-type]  # (registered)
            hash_of[b] = None
        self.evicted.extend(taken)
        return taken

    def evict(self, block: int) -> None:
        """Unregister one evictable block (it leaves the device tier, or is reused)."""
        if self._state[block] >= 0:
            raise KeyError(f"prefix cache: block {block} is not evictable")
        self.evictable.num -= 1
        self._unregister(block)

    def _unregister(self, block: int) -> None:
        del self.block_of[self._hash[block]]  # type: ignore[arg-type]  # (registered)
        self._hash[block] = None
        self._state[block] = 0
        self.evicted.append(block)

    def move(self, old: int, new: int) -> None:
        """A registered block in use moved to another id (the device tier shrank)."""
        block_hash = self._hash[old]
        if block_hash is None or self._state[old] <= 0:
            raise KeyError(f"prefix cache: block {old} is not registered and in use")
        self._hash[new], self._hash[old] = block_hash, None
        self.block_of[block_hash] = new
        self._state[new], self._state[old] = self._state[old], 0

    def check(self, counts: dict[int, int]) -> None:
        """`counts`: each block's number of tables. Raises AssertionError if the registry
        disagrees with the tables."""
        hash_of = self.hash_of
        if len(self.block_of) != len(hash_of) or any(
            self.block_of.get(h) != b for b, h in hash_of.items()
        ):
            raise AssertionError("prefix cache: hash and block maps disagree")
        state = self._state
        for b in hash_of:
            in_use = counts.get(b, 0)
            if in_use != max(0, state[b]) or (in_use == 0) != (state[b] < 0):
                raise AssertionError(f"prefix cache: block {b} held by {in_use} tables, "
                                     f"count {state[b]}")
        if any(s != 0 and self._hash[b] is None for b, s in enumerate(state)):
            raise AssertionError("prefix cache: a count or evictable block is unregistered")
        self.evictable.check()
        shared = [b for b, n in counts.items() if n > 1 and b not in hash_of]
        if shared:
            raise AssertionError(f"prefix cache: unregistered blocks shared: {shared}")
