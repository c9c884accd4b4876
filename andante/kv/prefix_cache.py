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
device tier's registry: hash <-> block maps, counts of registered blocks in use, and the
evictable blocks in LRU order. The block manager owns the free list and the tables.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

from andante.core.request import PrefixIds, Request, SyntheticTokens


def root_hash(model: str) -> int:
    """The parent hash of a request's first block: its model (KV of another model's
    weights is never shared). Stable across processes (crc32, not str hash)."""
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
    """The registered (content-hashed) blocks of the device tier."""

    def __init__(self) -> None:
        self.block_of: dict[int, int] = {}  # hash -> block
        self.hash_of: dict[int, int] = {}  # block -> hash
        self.refs: dict[int, int] = {}  # registered block in use -> its table count
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, LRU first
        self.evicted: list[int] = []  # blocks unregistered since `PendingHits.drain`

    @property
    def num_evictable(self) -> int:
        return len(self.evictable)

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
        evictable = self.evictable
        return sum(1 for b in blocks if b in evictable)

    def share(self, blocks: list[int]) -> None:
        """One more table holds each of these registered blocks."""
        refs, evictable = self.refs, self.evictable
        for b in blocks:
            if b in evictable:
                del evictable[b]
                refs[b] = 1
            else:
                refs[b] += 1

    def register(self, block: int, block_hash: int) -> bool:
        """Register a full, computed block held by one table; False if another block
        already holds this content (it stays unregistered: a private duplicate)."""
        if block_hash in self.block_of:
            return False
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash
        self.refs[block] = 1
        return True

    def register_run(self, table: list[int], hashes: list[int], start: int,
                     stop: int) -> list[int]:
        """`register` of table[j] under hashes[j] for j in [start, stop) (the hot loop of
        caching a step's computed blocks); returns the hashes newly registered."""
        block_of, hash_of, refs = self.block_of, self.hash_of, self.refs
        new: list[int] = []
        for j in range(start, stop):
            h = hashes[j]
            if h in block_of:
                continue
            b = table[j]
            block_of[h] = b
            hash_of[b] = h
            refs[b] = 1
            new.append(h)
        return new

    def release(self, blocks: list[int], keep_cached: bool = True) -> list[int]:
        """One table lets go of `blocks` (in table order); returns those now free and
        unregistered (the caller frees them). Registered ones whose count drops to 0
        become evictable, the table's last block first in line (vLLM's order), or are
        unregistered and returned if not `keep_cached`."""
        refs, hash_of, evictable = self.refs, self.hash_of, self.evictable
        if hash_of.keys().isdisjoint(blocks):
            return list(blocks)  # none registered
        plain: list[int] = []
        for b in reversed(blocks):
            if b not in hash_of:
                plain.append(b)
                continue
            count = refs[b] - 1
            if count:
                refs[b] = count
                continue
            del refs[b]
            if keep_cached:
                evictable[b] = None
            else:
                self._unregister(b)
                plain.append(b)
        plain.reverse()
        return plain

    def evict_lru(self, num: int) -> list[int]:
        """Unregister the `num` least recently released evictable blocks; returns them."""
        popitem, hash_of, block_of = self.evictable.popitem, self.hash_of, self.block_of
        if num == 1:  # (the common case: a decode's next block)
            b = popitem(last=False)[0]
            del block_of[hash_of.pop(b)]
            self.evicted.append(b)
            return [b]
        taken = [popitem(last=False)[0] for _ in range(num)]
        for b in taken:
            del block_of[hash_of.pop(b)]
        self.evicted.extend(taken)
        return taken

    def evict(self, block: int) -> None:
        """Unregister one evictable block (it leaves the device tier, or is reused)."""
        del self.evictable[block]
        self._unregister(block)

    def _unregister(self, block: int) -> None:
        del self.block_of[self.hash_of.pop(block)]
        self.evicted.append(block)

    def move(self, old: int, new: int) -> None:
        """A registered block in use moved to another id (the device tier shrank)."""
        block_hash = self.hash_of.pop(old)
        self.hash_of[new] = block_hash
        self.block_of[block_hash] = new
        self.refs[new] = self.refs.pop(old)

    def check(self, counts: dict[int, int]) -> None:
        """`counts`: each block's number of tables. Raises AssertionError if the registry
        disagrees with the tables."""
        if len(self.block_of) != len(self.hash_of) or any(
            self.block_of.get(h) != b for b, h in self.hash_of.items()
        ):
            raise AssertionError("prefix cache: hash and block maps disagree")
        for b in self.hash_of:
            in_use = counts.get(b, 0)
            if in_use != self.refs.get(b, 0) or (in_use == 0) != (b in self.evictable):
                raise AssertionError(f"prefix cache: block {b} held by {in_use} tables, "
                                     f"count {self.refs.get(b, 0)}")
        if set(self.refs) - set(self.hash_of) or set(self.evictable) - set(self.hash_of):
            raise AssertionError("prefix cache: a count or evictable block is unregistered")
        shared = [b for b, n in counts.items() if n > 1 and b not in self.hash_of]
        if shared:
            raise AssertionError(f"prefix cache: unregistered blocks shared: {shared}")
