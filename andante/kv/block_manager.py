"""Paged KV-cache block manager with a device tier and a host tier.

Each request owns a block table (list of block ids) on exactly one tier at a time:
the device tier while it runs or pauses, the host tier while swapped out. A request
with no table holds no KV (waiting, or preempted by recompute). The manager is pure
bookkeeping; moving the bytes is the executor's job, driven by the (src, dst) block
pairs that `swap_out` / `swap_in` return.

Design note: the one owner of KV feasibility (DESIGN.md rule 6), after vLLM v1's
`KVCacheManager.allocate_slots` (vllm/v1/core/kv_cache_manager.py): block arithmetic
and the admission watermark live here, and `allocate_slots` answers and allocates in
one call; a step's plan reserves through it as it decides. Within a step the executor
copies swap-outs before swap-ins, so a swap-in's host blocks are released only at
`end_step` (no swap-out of the step may overwrite them).

Prefix caching (`andante.kv.prefix_cache`, on unless `enable_prefix_caching=False`):
the scheduler `track`s each request whose content has an identity and, while it holds
no KV, `lookup_prefix` finds the longest run of its full blocks already cached (never
the whole prompt: at least one token is computed, for its logits). That hit is
tentative until `allocate_slots` admits the request: then the hit blocks are shared
(count + 1) and only the rest is allocated; if a hit block was evicted in between, the
request cannot be admitted this step and is due for a fresh lookup (the scheduler
looks up only the requests `take_due_lookups` names: `andante.kv.pending_hits`).
`cache_computed`
registers the blocks that a step filled. A shared block counts once in every figure;
free = never-cached free blocks + evictable cached ones, so the watermark and every
policy's accounting see one number. Swap-out copies every block of the request to the
host (shared ones too) and lets go of its device blocks: a shared block stays with its
other holders, a block no one else holds is unregistered and freed (its device copy is
not relied on after a swap); swap-in allocates fresh private device blocks.
Shrinking the device tier evicts cached free blocks above the new size and moves the
blocks in use (shared ones once, for every holder).

Policies ask these figures through their step's plan (`andante.engine.plan.StepPlan`):
blocks for a token count (`num_blocks_for`, also a module function for a policy with no
plan at hand), the most new blocks a run of tokens may take (`max_new_blocks_for`), the
free and total blocks above the admission watermark, the free blocks that keep the usage
below a fraction, and how many blocks an admission is short of; none redoes the
rounding or the watermark itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, overload

from andante.core.request import Request
from andante.kv.block_pool import BlockPool, OutOfBlocksError
from andante.kv.pending_hits import PendingHits
from andante.kv.prefix_cache import PrefixCache, RequestHashes

if TYPE_CHECKING:
    from numpy import float64
    from numpy.typing import NDArray


@overload
def num_blocks_for(num_tokens: int, block_size: int) -> int: ...


@overload
def num_blocks_for(num_tokens: NDArray[float64], block_size: int) -> NDArray[float64]: ...


def num_blocks_for(num_tokens: int | NDArray[float64], block_size: int,
                   ) -> int | NDArray[float64]:
    """Blocks of `block_size` tokens that hold `num_tokens` tokens (elementwise for an
    array of whole token counts): `KVBlockManager.num_blocks_for`, for a policy outside
    a step (an arrival, the simulator's fast paths)."""
    return -(-num_tokens // block_size)


def max_new_blocks_for(num_tokens: int, block_size: int) -> int:
    """The most new blocks that `num_tokens` tokens appended to any request may take
    (whatever its last block holds), with a block to spare."""
    return num_tokens // block_size + 1


class KVBlockManager:
    def __init__(
        self,
        block_size: int,
        num_device_blocks: int,
        num_host_blocks: int = 0,
        watermark: float = 0.01,
        enable_prefix_caching: bool = True,
    ) -> None:
        self._init_config(block_size, watermark)
        self._init_tiers(num_device_blocks, num_host_blocks)
        self._init_prefix_cache(enable_prefix_caching)

    def _init_config(self, block_size: int, watermark: float) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.block_size = block_size
        self.watermark = watermark

    def _init_tiers(self, num_device_blocks: int, num_host_blocks: int) -> None:
        self.device = BlockPool("device", num_device_blocks)
        self.host = BlockPool("host", num_host_blocks)
        self._device_tables: dict[str, list[int]] = {}
        self._host_tables: dict[str, list[int]] = {}
        self._host_released_at_end: list[int] = []  # host blocks of this step's swap-ins

    def _init_prefix_cache(self, enabled: bool) -> None:
        self.enable_prefix_caching = enabled
        self.cache = PrefixCache(self.device.num_blocks)
        self._hashes: dict[str, RequestHashes] = {}  # tracked requests
        self._pending = PendingHits(self.cache)  # tentative hits of tracked waiting requests
        self._next_to_cache: dict[str, int] = {}  # tracked holder -> first unregistered block

    # ---- figures --------------------------------------------------------------------
    @property
    def num_device_blocks(self) -> int:
        return self.device.num_blocks

    @property
    def num_free_device_blocks(self) -> int:
        """Free device blocks: never cached, or cached and held by no request (a shared
        block is one block)."""
        return self.device.num_free + self.cache.evictable.num

    @property
    def num_free_host_blocks(self) -> int:
        return self.host.num_free

    @property
    def num_cached_free_blocks(self) -> int:
        """Free device blocks that keep a cached prefix (evicted when needed)."""
        return len(self.cache.evictable)

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.device.num_blocks)

    @property
    def usage(self) -> float:
        """Fraction of device blocks in use (vLLM's kv_cache_usage_perc / 100)."""
        total = self.device.num_blocks
        return 1.0 - self.num_free_device_blocks / total if total else 0.0

    @property
    def num_blocks_above_watermark(self) -> int:
        """Device blocks admissions may fill: all of them but the watermark."""
        return self.device.num_blocks - self.watermark_blocks

    @property
    def num_free_blocks_above_watermark(self) -> int:
        """Free device blocks an admission may take now: the free ones less the
        watermark (negative below it)."""
        return self.num_free_device_blocks - self.watermark_blocks

    def min_free_blocks_below_usage(self, usage: float) -> int:
        """The free device blocks that certainly keep `usage` (the fraction of blocks
        in use) below `usage`, with a block's margin over rounding."""
        return math.ceil((1.0 - usage) * self.device.num_blocks) + 1

    @overload
    def num_blocks_for(self, num_tokens: int) -> int: ...

    @overload
    def num_blocks_for(self, num_tokens: NDArray[float64]) -> NDArray[float64]: ...

    def num_blocks_for(self, num_tokens: int | NDArray[float64]) -> int | NDArray[float64]:
        """Blocks that hold `num_tokens` tokens (elementwise for an array of whole token
        counts)."""
        return -(-num_tokens // self.block_size)

    def max_new_blocks_for(self, num_tokens: int) -> int:
        """See the module function `max_new_blocks_for`."""
        return max_new_blocks_for(num_tokens, self.block_size)

    @overload
    def num_slots_in(self, num_blocks: int) -> int: ...

    @overload
    def num_slots_in(self, num_blocks: NDArray[float64]) -> NDArray[float64]: ...

    def num_slots_in(self, num_blocks: int | NDArray[float64]) -> int | NDArray[float64]:
        """Tokens that `num_blocks` blocks hold (elementwise for an array)."""
        return num_blocks * self.block_size

    def block_table(self, request_id: str) -> list[int]:
        """The request's device block table (empty if it holds no device KV)."""
        return self._device_tables.get(request_id, [])

    def num_device_blocks_of(self, request_id: str) -> int:
        return len(self._device_tables.get(request_id, ()))

    def num_blocks_of(self, request_id: str) -> int:
        """Blocks the request holds on whichever tier holds its KV."""
        table = self._device_tables.get(request_id)
        if table is None:
            table = self._host_tables.get(request_id, [])
        return len(table)

    def holds_kv(self, request_id: str) -> bool:
        return request_id in self._device_tables or request_id in self._host_tables

    # ---- prefix caching ---------------------------------------------------------------
    def track(self, req: Request) -> bool:
        """Follow `req`'s content for prefix caching (False: caching is off); it is due
        for a lookup."""
        if not self.enable_prefix_caching:
            return False
        if req.request_id not in self._hashes:
            self._hashes[req.request_id] = RequestHashes(req, self.block_size)
            self._pending.dirty.add(req.request_id)
        return True

    def is_tracked(self, request_id: str) -> bool:
        return request_id in self._hashes

    def forget(self, request_id: str) -> None:
        """Stop following a request (it finished or left); call after `free`."""
        self._hashes.pop(request_id, None)
        self._pending.pop(request_id)
        self._pending.dirty.discard(request_id)
        self._next_to_cache.pop(request_id, None)

    def take_due_lookups(self) -> set[str]:
        """The tracked requests whose hit may have changed since their last lookup
        (new, freed, a hit block evicted, or the block after the hit cached)."""
        return self._pending.take_dirty()

    def lookup_prefix(self, req: Request) -> int:
        """Tokens of the tracked request `req` (holding no KV) already cached, at most
        all its tokens but one; a tentative hit until `allocate_slots` admits it."""
        rid = req.request_id
        hasher = self._hashes.get(rid)
        if hasher is None or self.holds_kv(rid):
            return 0
        max_blocks = min((req.num_tokens - 1) // self.block_size, hasher.num_cacheable())
        if max_blocks <= 0:
            self._pending.pop(rid)  # nothing of it can be cached (yet)
            return 0
        hashes = hasher.chain(max_blocks)
        blocks = self.cache.longest_prefix(hashes, max_blocks)
        more = len(blocks) < min(max_blocks, len(hashes))
        self._pending.record(rid, blocks, hashes[len(blocks)] if more else None)
        return len(blocks) * self.block_size

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (vLLM's reset_prefix_cache): the KV tensors behind
        them were released (sleep mode). Only while no request holds device blocks;
        returns how many cached blocks went back to the free pool."""
        if self._device_tables or self.cache.evictable.num != len(self.cache.block_of):
            raise RuntimeError("reset_prefix_cache: requests still hold KV blocks")
        freed = self.cache.evict_lru(len(self.cache.evictable))
        self.device.free(freed)
        self._pending.drain()
        return len(freed)

    def _valid_hit(self, request_id: str) -> list[int] | None:
        """The request's tentative hit blocks ([] if none); None if one was evicted
        since the lookup (the request's num_computed_tokens is stale)."""
        return self._pending.blocks_of(request_id)

    def cache_computed(self, requests: Iterable[Request]) -> None:
        """Register the full blocks that the requests' KV now holds (after a step)."""
        next_to_cache = self._next_to_cache
        if not next_to_cache:
            return
        size = self.block_size
        for req in requests:
            start = next_to_cache.get(req.request_id)
            if start is not None and req.num_computed_tokens >= (start + 1) * size:
                self._register(req, start, req.num_computed_tokens // size)

    def _register(self, req: Request, start: int, stop: int) -> None:
        rid = req.request_id
        hasher = self._hashes[rid]
        shareable = hasher.num_shareable
        if shareable is not None and stop > shareable:
            stop = shareable
        hashes = hasher.chain(stop)
        table = self._device_tables[rid]
        stop = min(stop, len(hashes), len(table))
        new = self.cache.register_run(table, hashes, start, stop)
        if new:
            self._pending.registered_all(new)
        if shareable is not None and stop >= shareable:
            del self._next_to_cache[rid]  # its shareable content ends here
        else:
            self._next_to_cache[rid] = stop

    def _start_caching(self, request_id: str, start: int) -> None:
        """Register the request's shareable blocks from `start` on as they are computed."""
        hasher = self._hashes.get(request_id)
        if hasher is not None and (hasher.num_shareable is None or start < hasher.num_shareable):
            self._next_to_cache[request_id] = start

    def _register_own(self, request_id: str, table: list[int]) -> None:
        """Register the computed full blocks of a simulated request's own content before
        it lets go of them to run again (a recompute preemption): only it can hit them."""
        hasher = self._hashes[request_id]
        start = hasher.num_shareable
        if start is None:
            return  # real tokens: registered as computed
        stop = min(len(table), hasher.num_computed_blocks())
        if stop <= start:
            return
        self.cache.register_run(table, hasher.upto(stop), start, stop)
        if stop > hasher.num_own_cached:
            hasher.num_own_cached = stop

    # ---- allocation -----------------------------------------------------------------
    def num_new_blocks_needed(self, request_id: str, num_total_tokens: int) -> int:
        """Blocks to take from the free ones so the request's KV covers
        `num_total_tokens` (for an admission: besides its shared cached blocks, the
        evictable ones among them, which stop being free)."""
        table = self._device_tables.get(request_id)  # inlined: the simulator's hot path
        if table is None:
            table = self._host_tables.get(request_id)
            if table is None and self._pending.hits:
                return self._admission_need(request_id, num_total_tokens)
        num_held = len(table) if table is not None else 0
        return max(0, -(-num_total_tokens // self.block_size) - num_held)

    def _admission_need(self, request_id: str, num_total_tokens: int) -> int:
        blocks = self._valid_hit(request_id) or []
        new = max(0, -(-num_total_tokens // self.block_size) - len(blocks))
        return new + self.cache.count_evictable(blocks)

    def num_free_blocks_for(self, request_id: str) -> int:
        """Device blocks the request may take: an admission (a request holding no KV)
        leaves the watermark free, as vLLM does; a request holding KV may use it."""
        if self.holds_kv(request_id):
            return self.num_free_device_blocks
        return self.num_free_device_blocks - self.watermark_blocks

    def num_blocks_short(self, request_id: str, num_total_tokens: int) -> int:
        """How many more free blocks the request's device KV needs to cover
        `num_total_tokens` (0 if `can_allocate` would find them, a stale prefix hit
        aside): an admission's need counts the watermark."""
        need = self.num_new_blocks_needed(request_id, num_total_tokens)
        return max(0, need - self.num_free_blocks_for(request_id))

    def max_num_tokens_for(self, request_id: str) -> int:
        """Tokens the request's device KV could cover with the free blocks it may take
        (0 for an admission whose tentative hit went stale)."""
        held = self.num_device_blocks_of(request_id)
        free = self.num_free_blocks_for(request_id)
        if not self.holds_kv(request_id) and self._pending.hits:
            blocks = self._valid_hit(request_id)
            if blocks is None:
                return 0
            held = len(blocks)
            free -= self.cache.count_evictable(blocks)
        return (held + max(0, free)) * self.block_size

    def can_allocate(self, request_id: str, num_total_tokens: int) -> bool:
        """Could the request's device KV grow to cover `num_total_tokens`?"""
        if self._pending.hits and not self.holds_kv(request_id) and (
                self._valid_hit(request_id) is None):
            return False
        need = self.num_new_blocks_needed(request_id, num_total_tokens)
        return need <= self.num_free_blocks_for(request_id)

    def refuses_for_now(self, request_id: str, num_total_tokens: int) -> bool:
        """Is the request, holding no KV or swapped out, sure to find no room for
        `num_total_tokens` (an admission, or a swap-in growing to them) for as long as the
        free device blocks only shrink and no block is registered in the prefix cache
        (`registers_more`)? Not sure where its tentative hit is stale or due for a
        lookup: the next lookup may leave it needing fewer blocks."""
        if request_id in self._host_tables:
            need = self.num_new_blocks_needed(request_id, num_total_tokens)
            return not self.can_swap_in(request_id, need)
        # `hit_is_settled` and not `can_allocate`, fused (the run-ahead proofs' hot loop
        # over a long queue): one look at the tentative hit instead of three
        pending = self._pending
        blocks = pending.blocks_of(request_id) if pending.hits else []
        if blocks is None or request_id in pending.dirty:
            return False  # stale, or due for a lookup: not settled
        need = -(-num_total_tokens // self.block_size)
        table = self._device_tables.get(request_id)
        if table is not None:
            return need - len(table) > self.num_free_device_blocks
        need = max(0, need - len(blocks))
        if blocks:
            need += self.cache.count_evictable(blocks)
        return need > self.num_free_device_blocks - self.watermark_blocks

    def hit_is_settled(self, request_id: str) -> bool:
        """Is the tentative prefix hit of a request holding no device KV neither stale
        nor due for a lookup (so that, while nothing is registered, it can only shrink
        by evictions)?"""
        if self._pending.hits and self._valid_hit(request_id) is None:
            return False
        return request_id not in self._pending.dirty

    def registers_more(self, request_ids: Iterable[str]) -> bool:
        """Would computing more tokens of any of these requests register blocks in the
        prefix cache (where a waiting request's tentative hit may grow)?"""
        next_to_cache = self._next_to_cache
        return bool(next_to_cache) and any(rid in next_to_cache for rid in request_ids)

    def allocate_slots(self, request_id: str, num_total_tokens: int) -> list[int] | None:
        """Grow (or create) the request's device table to cover `num_total_tokens`;
        returns the new block ids, or None (nothing allocated) if they do not fit.
        An admission shares its tentative prefix hit (`lookup_prefix`)."""
        if request_id in self._host_tables or not self.can_allocate(request_id, num_total_tokens):
            return None  # a swapped request must swap in first
        if request_id in self._device_tables:
            return self.append_slots(request_id, num_total_tokens)
        return self.allocate(request_id, num_total_tokens)

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """Give a request with no KV a device table covering `num_tokens`, starting with
        the blocks of its tentative prefix hit, shared."""
        if request_id in self._device_tables or request_id in self._host_tables:
            raise ValueError(f"request {request_id!r} already holds KV blocks")
        self._pending.drain()
        hit = self._pending.pop(request_id)
        shared = hit.blocks if hit is not None and hit.valid else []
        self.cache.share(shared)
        table = shared + self._take(self.num_blocks_for(num_tokens) - len(shared))
        self._device_tables[request_id] = table
        self._start_caching(request_id, len(shared))
        return table

    def append_slots(self, request_id: str, num_total_tokens: int) -> list[int]:
        """Grow the device table to cover `num_total_tokens`; returns the new block ids."""
        table = self._device_tables.get(request_id)
        if table is None:
            raise KeyError(f"request {request_id!r} holds no device blocks")
        missing = -(-num_total_tokens // self.block_size) - len(table)
        if missing <= 0:
            return []
        new = self._take(missing)
        table.extend(new)
        return new

    def _take(self, num: int) -> list[int]:
        """`num` fresh device blocks: never-cached free ones first, then evicted cached
        ones, least recently released first."""
        pool = self.device
        if num <= pool.num_free:
            return pool.allocate(num)
        if num > pool.num_free + len(self.cache.evictable):
            raise OutOfBlocksError(f"device: asked for {num} blocks, "
                                   f"{self.num_free_device_blocks} free")
        num_evicted = num - pool.num_free
        fresh = pool.allocate(pool.num_free) + self.cache.evict_lru(num_evicted)
        self._pending.drain()
        return fresh

    def _release_device(self, request_id: str, table: list[int], keep_cached: bool,
                        resumes: bool = False) -> list[int]:
        """Let go of a device table; returns its blocks that became free and unregistered
        (the caller frees them). Untracked tables hold no registered block. Blocks of a
        simulated request's own content stay cached only if it `resumes` here."""
        self._next_to_cache.pop(request_id, None)
        hasher = self._hashes.get(request_id)
        if hasher is None:
            return table
        self._pending.dirty.add(request_id)  # holds no device KV now: due for a lookup
        shareable = hasher.num_shareable
        if not keep_cached or shareable is None:
            plain = self.cache.release(table, keep_cached)
        elif resumes:
            self._register_own(request_id, table)
            plain = self.cache.release(table, True)
        else:  # its own blocks can never be hit again: freed uncached
            own = self.cache.release(table[shareable:], False) if len(table) > shareable else []
            plain = self.cache.release(table[:shareable], True) + own
        self._pending.drain()
        return plain

    def free(self, request_id: str, *, resumes: bool = False) -> int:
        """Release every block the request holds on either tier; returns how many (a
        shared block stays with its other holders, a cached one stays cached). A request
        that `resumes` here (preempted by recompute) keeps its computed blocks cached for
        its return, as vLLM v1's APC does."""
        freed = 0
        table = self._device_tables.pop(request_id, None)
        if table is not None:
            self.device.free(self._release_device(request_id, table, True, resumes))
            freed += len(table)
        host_table = self._host_tables.pop(request_id, None)
        if host_table is not None:
            self.host.free(host_table)
            freed += len(host_table)
        return freed

    # ---- swapping -------------------------------------------------------------------
    def can_swap_out(self, request_id: str) -> bool:
        return len(self._device_tables.get(request_id, ())) <= self.host.num_free

    def swap_out(self, request_id: str) -> list[tuple[int, int]]:
        """Move the request's blocks to the host tier; returns (device, host) pairs."""
        if not self.can_swap_out(request_id):
            raise OutOfBlocksError(f"host: no room to swap out {request_id!r}")
        table = self._device_tables.pop(request_id)
        host_table = self.host.allocate(len(table))
        # Reused last: a copy overlapped with the next forward pass (FastServe §4.2)
        # need not finish first unless that pass really needs these blocks.
        self.device.free_reuse_last(self._release_device(request_id, table, keep_cached=False))
        self._host_tables[request_id] = host_table
        return list(zip(table, host_table, strict=True))

    def can_swap_in(self, request_id: str, num_extra_blocks: int = 0) -> bool:
        """Could the swapped request come back with `num_extra_blocks` more to grow?"""
        table = self._host_tables.get(request_id)
        return table is not None and len(table) + num_extra_blocks <= self.num_free_device_blocks

    def swap_in(self, request_id: str) -> list[tuple[int, int]]:
        """Move the request's blocks back to the device (fresh, private blocks: the
        blocks that a step fills from now on are registered as usual); returns (host,
        device) pairs."""
        if not self.can_swap_in(request_id):
            raise OutOfBlocksError(f"device: no room to swap in {request_id!r}")
        host_table = self._host_tables.pop(request_id)
        table = self._take(len(host_table))
        self._host_released_at_end.extend(host_table)  # read by this step's copies
        self._device_tables[request_id] = table
        self._start_caching(request_id, 0)  # registered unless cached elsewhere
        return list(zip(host_table, table, strict=True))

    def end_step(self) -> None:
        """The step's swaps are decided: release the host blocks its swap-ins read."""
        if self._host_released_at_end:
            self.host.free(self._host_released_at_end)
            self._host_released_at_end = []

    # ---- resizing (KunServe: dropped weights become KV blocks, and back) -----------
    def resize_device(self, num_blocks: int) -> dict[int, int] | None:
        """Give the device tier `num_blocks` blocks. Growing always succeeds. Shrinking
        evicts the cached free blocks >= `num_blocks`, moves the KV held in the others
        into free blocks below it and returns that {old id: new id} map for the executor
        to copy; None (nothing changed) if the blocks in use do not fit in `num_blocks`."""
        current = self.device.num_blocks
        if num_blocks >= current:
            self.device.grow(num_blocks - current)
            self.cache.resize(num_blocks)
            return {}
        if self.device.num_used - len(self.cache.evictable) > num_blocks:
            return None
        high_cached = [b for b in self.cache.evictable if b >= num_blocks]
        for b in high_cached:
            self.cache.evict(b)
        self.device.free(high_cached)
        moved = self._relocate_below(num_blocks)
        self._pending.drain()
        self.device.shrink_to(num_blocks)
        self.cache.resize(num_blocks)
        return moved

    def _relocate_below(self, limit: int) -> dict[int, int]:
        held = (b for table in self._device_tables.values() for b in table)
        high = list(dict.fromkeys(b for b in held if b >= limit))  # a shared block once
        if not high:
            return {}
        spare = [b for b in self.device.free_ids() if b < limit][: len(high)]
        self.device.take(spare)
        low_cached = [b for b in self.cache.evictable if b < limit][: len(high) - len(spare)]
        for b in low_cached:
            self.cache.evict(b)  # its block is already taken from the free list
        spare += low_cached
        self.device.free(high)
        moved = dict(zip(high, spare, strict=True))
        for old, new in moved.items():
            if self.cache.is_registered(old):
                self.cache.move(old, new)
        for table in self._device_tables.values():
            table[:] = [moved.get(b, b) for b in table]
        return moved

    # ---- invariants -----------------------------------------------------------------
    def check_invariants(self) -> None:
        """Conservation per tier, reference counts of shared blocks, single ownership
        of the others; raises AssertionError if broken."""
        counts: dict[int, int] = {}
        for table in self._device_tables.values():
            for b in table:
                counts[b] = counts.get(b, 0) + 1
        self.cache.check(counts)
        self._pending.check()
        cached_free = list(self.cache.evictable)
        self._check_tier(self.device, list(counts) + cached_free)
        host_owned = [b for table in self._host_tables.values() for b in table]
        if len(host_owned) != len(set(host_owned)):
            raise AssertionError("host: a block is owned twice")
        self._check_tier(self.host, host_owned + self._host_released_at_end)
        both = set(self._device_tables) & set(self._host_tables)
        if both:
            raise AssertionError(f"requests hold blocks on both tiers: {sorted(both)}")

    @staticmethod
    def _check_tier(pool: BlockPool, taken: list[int]) -> None:
        free = pool.free_ids()
        if len(taken) != len(set(taken)):
            raise AssertionError(f"{pool.name}: a block is taken twice")
        if set(taken) & set(free):
            raise AssertionError(f"{pool.name}: a block is both taken and free")
        if len(taken) + len(free) != pool.num_blocks:
            raise AssertionError(
                f"{pool.name}: taken {len(taken)} + free {len(free)} != {pool.num_blocks}"
            )
        if any(not 0 <= b < pool.num_blocks for b in taken + free):
            raise AssertionError(f"{pool.name}: block id out of range")
