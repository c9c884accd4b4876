"""The `cache-aware` router: send a request where its prefix is cached, unless that
instance is too loaded (SGLang's cache-aware load balancing; llm-d's prefix scorer).

Design note (SGLang router, "cache-aware load balancing"; llm-d inference scheduler,
prefix-cache scorer in its estimated mode). The router keeps, per instance, an index of
the KV blocks it expects there: the content hashes of the full prompt blocks of the
requests it routed to it (`PrefixIndex`, LRU, at most the instance's KV blocks from its
load report), hashed as the block manager hashes them (`andante.kv.prefix_cache`:
chained from the model, from real tokens or a simulated prompt's content ids), so an
index fed by an instance's own report of the hashes it holds would read the same. Its
inputs are thus only what any instance can report (load, block count) plus what the
router saw, the same for simulated, in-process, Ray and upstream HTTP instances.

For a request: if the cluster is imbalanced (the most and the least loaded instance, in
requests held and in transit, differ by more than `balance_abs` and by a factor above
`balance_rel`), it goes to the least-loaded instance (as `least-loaded` chooses);
otherwise to the instance whose index holds the longest run of its leading blocks, if
that covers at least `cache_threshold` of its prompt blocks, fewer held requests
breaking ties; else to the least-loaded instance. Its blocks are then recorded for the
chosen instance (most recently used); a request's own blocks (a simulated prompt's
content of its own, never shared) are not recorded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from andante.cluster.router import InstanceView, _load_key, _RouterBase
from andante.core.request import Request
from andante.kv.prefix_cache import RequestHashes

DEFAULT_INDEX_BLOCKS = 1 << 20  # before an instance reports its block count


class PrefixIndex:
    """The block hashes one instance is expected to hold, least recently used first."""

    def __init__(self) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` held here."""
        blocks = self._blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def record(self, hashes: Sequence[int], capacity: int) -> None:
        """The instance now holds `hashes` (most recently used); keep `capacity` blocks."""
        blocks = self._blocks
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        excess = len(blocks) - capacity
        for _ in range(max(0, excess)):
            blocks.popitem(last=False)


def prompt_block_hashes(req: Request, block_size: int) -> list[int]:
    """Content hashes of the request's full prompt blocks that another request may
    share (at most all its prompt tokens but one: the engine computes that one)."""
    hasher = RequestHashes(req, block_size)
    limit = (req.num_prompt_tokens - 1) // block_size
    if hasher.num_shareable is not None:
        limit = min(limit, hasher.num_shareable)
    return list(hasher.upto(limit)) if limit > 0 else []


class CacheAwareRouter(_RouterBase):
    name = "cache-aware"

    def __init__(self, cache_threshold: float = 0.5, balance_abs: int = 16,
                 balance_rel: float = 1.5, block_size: int = 16, **options: Any) -> None:
        super().__init__(**options)
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold!r}")
        if balance_abs < 0 or not balance_rel >= 1.0:
            raise ValueError(f"balance_abs must be >= 0 and balance_rel >= 1, got "
                             f"{balance_abs!r}, {balance_rel!r}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.block_size = block_size
        self._indexes: dict[int, PrefixIndex] = {}
        self.num_cache_routed = 0  # requests sent by their prefix (not by load)

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        alive = [v for v in instances if v.alive]
        if not alive:
            return None
        hashes = prompt_block_hashes(req, self.block_size)
        chosen = self._by_prefix(hashes, alive) if hashes else None
        if chosen is None:
            chosen = min(alive, key=_load_key)
        else:
            self.num_cache_routed += 1
        if hashes:
            self._record(chosen, hashes)
        return chosen.index

    def _by_prefix(self, hashes: list[int], alive: list[InstanceView]) -> InstanceView | None:
        """The instance holding the longest cached prefix, if it covers enough and the
        cluster is balanced; None: route by load."""
        held = {v.index: _num_held(v) for v in alive}
        most, least = max(held.values()), min(held.values())
        if most - least > self.balance_abs and most > least * self.balance_rel:
            return None
        best, best_key = None, (0, 0)
        for view in alive:
            index = self._indexes.get(view.index)
            matched = index.match(hashes) if index is not None else 0
            key = (matched, -held[view.index])
            if matched and key > best_key:
                best, best_key = view, key
        if best is None or best_key[0] < self.cache_threshold * len(hashes):
            return None
        return best

    def _record(self, view: InstanceView, hashes: list[int]) -> None:
        index = self._indexes.setdefault(view.index, PrefixIndex())
        capacity = view.load.stats.num_blocks or DEFAULT_INDEX_BLOCKS
        index.record(hashes, capacity)


def _num_held(view: InstanceView) -> int:
    return view.load.stats.num_requests + view.num_in_transit
