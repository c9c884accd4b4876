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
"""

from __future__ import annotations

from andante.kv.block_pool import BlockPool, OutOfBlocksError


class KVBlockManager:
    def __init__(
        self,
        block_size: int,
        num_device_blocks: int,
        num_host_blocks: int = 0,
        watermark: float = 0.01,
    ) -> None:
        self._init_config(block_size, watermark)
        self._init_tiers(num_device_blocks, num_host_blocks)

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

    # ---- figures --------------------------------------------------------------------
    @property
    def num_device_blocks(self) -> int:
        return self.device.num_blocks

    @property
    def num_free_device_blocks(self) -> int:
        return self.device.num_free

    @property
    def num_free_host_blocks(self) -> int:
        return self.host.num_free

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.device.num_blocks)

    @property
    def usage(self) -> float:
        """Fraction of device blocks in use (vLLM's kv_cache_usage_perc / 100)."""
        total = self.device.num_blocks
        return self.device.num_used / total if total else 0.0

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

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

    # ---- allocation -----------------------------------------------------------------
    def num_new_blocks_needed(self, request_id: str, num_total_tokens: int) -> int:
        """Blocks to add so the request's KV covers `num_total_tokens`."""
        table = self._device_tables.get(request_id)  # inlined: the simulator's hot path
        if table is None:
            table = self._host_tables.get(request_id, [])
        return max(0, -(-num_total_tokens // self.block_size) - len(table))

    def num_free_blocks_for(self, request_id: str) -> int:
        """Device blocks the request may take: an admission (a request holding no KV)
        leaves the watermark free, as vLLM does; a request holding KV may use it."""
        if self.holds_kv(request_id):
            return self.device.num_free
        return self.device.num_free - self.watermark_blocks

    def can_allocate(self, request_id: str, num_total_tokens: int) -> bool:
        """Could the request's device KV grow to cover `num_total_tokens`?"""
        need = self.num_new_blocks_needed(request_id, num_total_tokens)
        return need <= self.num_free_blocks_for(request_id)

    def allocate_slots(self, request_id: str, num_total_tokens: int) -> list[int] | None:
        """Grow (or create) the request's device table to cover `num_total_tokens`;
        returns the new block ids, or None (nothing allocated) if they do not fit."""
        if request_id in self._host_tables or not self.can_allocate(request_id, num_total_tokens):
            return None  # a swapped request must swap in first
        if request_id in self._device_tables:
            return self.append_slots(request_id, num_total_tokens)
        return self.allocate(request_id, num_total_tokens)

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """Give a request with no KV a device table covering `num_tokens`."""
        if request_id in self._device_tables or request_id in self._host_tables:
            raise ValueError(f"request {request_id!r} already holds KV blocks")
        table = self.device.allocate(self.num_blocks_for(num_tokens))
        self._device_tables[request_id] = table
        return table

    def append_slots(self, request_id: str, num_total_tokens: int) -> list[int]:
        """Grow the device table to cover `num_total_tokens`; returns the new block ids."""
        table = self._device_tables.get(request_id)
        if table is None:
            raise KeyError(f"request {request_id!r} holds no device blocks")
        missing = -(-num_total_tokens // self.block_size) - len(table)
        if missing <= 0:
            return []
        new = self.device.allocate(missing)
        table.extend(new)
        return new

    def free(self, request_id: str) -> int:
        """Release every block the request holds on either tier; returns how many."""
        freed = 0
        table = self._device_tables.pop(request_id, None)
        if table is not None:
            self.device.free(table)
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
        self.device.free_reuse_last(table)
        self._host_tables[request_id] = host_table
        return list(zip(table, host_table, strict=True))

    def can_swap_in(self, request_id: str, num_extra_blocks: int = 0) -> bool:
        """Could the swapped request come back with `num_extra_blocks` more to grow?"""
        table = self._host_tables.get(request_id)
        return table is not None and len(table) + num_extra_blocks <= self.device.num_free

    def swap_in(self, request_id: str) -> list[tuple[int, int]]:
        """Move the request's blocks back to the device; returns (host, device) pairs."""
        if not self.can_swap_in(request_id):
            raise OutOfBlocksError(f"device: no room to swap in {request_id!r}")
        host_table = self._host_tables.pop(request_id)
        table = self.device.allocate(len(host_table))
        self._host_released_at_end.extend(host_table)  # read by this step's copies
        self._device_tables[request_id] = table
        return list(zip(host_table, table, strict=True))

    def end_step(self) -> None:
        """The step's swaps are decided: release the host blocks its swap-ins read."""
        if self._host_released_at_end:
            self.host.free(self._host_released_at_end)
            self._host_released_at_end = []

    # ---- resizing (KunServe: dropped weights become KV blocks, and back) -----------
    def resize_device(self, num_blocks: int) -> dict[int, int] | None:
        """Give the device tier `num_blocks` blocks. Growing always succeeds. Shrinking
        moves the KV held in blocks >= `num_blocks` into free blocks below it and
        returns that {old id: new id} map for the executor to copy; None (nothing
        changed) if the blocks in use do not fit in `num_blocks`."""
        current = self.device.num_blocks
        if num_blocks >= current:
            self.device.grow(num_blocks - current)
            return {}
        if self.device.num_used > num_blocks:
            return None
        moved = self._relocate_below(num_blocks)
        self.device.shrink_to(num_blocks)
        return moved

    def _relocate_below(self, limit: int) -> dict[int, int]:
        high = [b for table in self._device_tables.values() for b in table if b >= limit]
        if not high:
            return {}
        spare = [b for b in self.device.free_ids() if b < limit][: len(high)]
        self.device.take(spare)
        self.device.free(high)
        moved = dict(zip(high, spare, strict=True))
        for table in self._device_tables.values():
            table[:] = [moved.get(b, b) for b in table]
        return moved

    # ---- invariants -----------------------------------------------------------------
    def check_invariants(self) -> None:
        """Conservation per tier and single ownership; raises AssertionError if broken."""
        for pool, tables, releasing in (
            (self.device, self._device_tables, []),
            (self.host, self._host_tables, self._host_released_at_end),
        ):
            owned = [b for table in tables.values() for b in table] + releasing
            free = pool.free_ids()
            if len(owned) != len(set(owned)):
                raise AssertionError(f"{pool.name}: a block is owned twice")
            if set(owned) & set(free):
                raise AssertionError(f"{pool.name}: a block is both owned and free")
            if len(owned) + len(free) != pool.num_blocks:
                raise AssertionError(
                    f"{pool.name}: used {len(owned)} + free {len(free)} != {pool.num_blocks}"
                )
            if any(not 0 <= b < pool.num_blocks for b in owned + free):
                raise AssertionError(f"{pool.name}: block id out of range")
        both = set(self._device_tables) & set(self._host_tables)
        if both:
            raise AssertionError(f"requests hold blocks on both tiers: {sorted(both)}")
