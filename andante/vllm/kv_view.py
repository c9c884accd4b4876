"""vLLM's KV cache manager seen through the block-manager interface `StepPlan` asks.

Design note (DESIGN.md §2.6, one owner of each decision). Inside vLLM, vLLM's
`KVCacheManager` owns the blocks; andante's policies ask the plan what fits and the
plan asks this view, which answers from vLLM's own figures and allocates through
vLLM's own `allocate_slots` (the same arguments vLLM's scheduler passes, prefix-cache
hits included), so blocks, their reference counts and the prefix cache stay vLLM's.
One KV cache group of full attention (the adapter checks it at startup), no host tier:
vLLM v1 preempts by recompute only, so `can_swap_out` is always False and every policy
falls back to recompute (FastServe's proactive swapping included).

A preemption the plan records (`free`) is vLLM's own `_preempt_request` on the
scheduler (`Preempter`), so its queue, events and counters (/metrics'
vllm:num_preemptions) are vLLM's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from andante.kv.block_manager import max_new_blocks_for

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.request import Request as VllmRequest


class Preempter(Protocol):
    def preempt(self, request_id: str) -> None: ...


@dataclass(slots=True)
class PrefixHit:
    """A waiting request's prefix-cache hit, looked up at the start of a step."""

    blocks: KVCacheBlocks
    num_tokens: int
    shared_prefix_boundary: int = 0


class VllmKVView:
    """The KVBlockManager methods StepPlan calls, answered by vLLM's KVCacheManager."""

    def __init__(self, manager: KVCacheManager, requests: dict[str, VllmRequest],
                 preempter: Preempter, reserve_full_sequence: bool = False) -> None:
        self.manager = manager
        self.reserve_full_sequence = reserve_full_sequence  # vLLM's reserve_full_isl
        self.requests = requests  # vLLM's own request table (the scheduler's)
        self.preempter = preempter
        self.block_pool = manager.block_pool
        self._blocks = manager.coordinator.single_type_managers[0].req_to_blocks
        self.block_size = manager.coordinator.single_type_managers[0].block_size
        self.num_device_blocks = self.block_pool.num_gpu_blocks - 1  # less the null block
        self.watermark_blocks = manager.watermark_blocks
        self.hits: dict[str, PrefixHit] = {}  # this step's hits of waiting requests
        self.new_blocks: dict[str, KVCacheBlocks] = {}  # this step's allocations

    def start_step(self, hits: dict[str, PrefixHit]) -> None:
        self.hits = hits
        self.new_blocks = {}

    # ---- figures --------------------------------------------------------------------
    @property
    def num_free_device_blocks(self) -> int:
        return int(self.block_pool.get_num_free_blocks())

    num_free_host_blocks = 0

    @property
    def usage(self) -> float:
        return float(self.block_pool.get_usage())

    @property
    def num_blocks_above_watermark(self) -> int:
        return self.num_device_blocks - self.watermark_blocks

    @property
    def num_free_blocks_above_watermark(self) -> int:
        return self.num_free_device_blocks - self.watermark_blocks

    def min_free_blocks_below_usage(self, usage: float) -> int:
        return math.ceil((1.0 - usage) * self.num_device_blocks) + 1

    def num_blocks_for(self, num_tokens: Any) -> Any:
        return -(-num_tokens // self.block_size)

    def max_new_blocks_for(self, num_tokens: int) -> int:
        return max_new_blocks_for(num_tokens, self.block_size)

    def num_slots_in(self, num_blocks: Any) -> Any:
        return num_blocks * self.block_size

    def num_device_blocks_of(self, request_id: str) -> int:
        blocks = self._blocks.get(request_id)
        return len(blocks) if blocks is not None else 0

    num_blocks_of = num_device_blocks_of

    def holds_kv(self, request_id: str) -> bool:
        return bool(self._blocks.get(request_id))

    # ---- allocation -----------------------------------------------------------------
    def num_new_blocks_needed(self, request_id: str, num_total_tokens: int) -> int:
        """vLLM's count of blocks to take from the free ones (cached free blocks a hit
        reuses included), as `allocate_slots` computes it. With vLLM's
        `scheduler_reserve_full_isl` (its default) an admission needs room for its
        whole sequence, whatever chunk it starts with."""
        req = self.requests[request_id]
        admission = not self.holds_kv(request_id)
        hit = self.hits.get(request_id) if admission else None
        blocks = hit.blocks.blocks if hit is not None else \
            self.manager.empty_kv_cache_blocks.blocks
        local = req.num_computed_tokens + (hit.num_tokens if hit is not None else 0)
        full = admission and self.reserve_full_sequence
        if full:
            num_total_tokens = max(num_total_tokens,
                                   min(req.num_tokens, self.manager.max_model_len))
        return int(self.manager.coordinator.get_num_blocks_to_allocate(
            request_id=request_id, num_tokens=num_total_tokens, new_computed_blocks=blocks,
            num_encoder_tokens=0, total_computed_tokens=local,
            num_local_computed_tokens=local, num_tokens_main_model=num_total_tokens,
            apply_admission_cap=full,
            prefill_end=max(req.num_prompt_tokens, req.num_tokens - 1)))

    def num_free_blocks_for(self, request_id: str) -> int:
        """An admission leaves the watermark free (vLLM's `watermark`, 0 by default)."""
        free = self.num_free_device_blocks
        return free if self.holds_kv(request_id) else free - self.watermark_blocks

    def num_blocks_short(self, request_id: str, num_total_tokens: int) -> int:
        need = self.num_new_blocks_needed(request_id, num_total_tokens)
        return max(0, need - self.num_free_blocks_for(request_id))

    def max_num_tokens_for(self, request_id: str) -> int:
        held = self.num_device_blocks_of(request_id)
        free = self.num_free_blocks_for(request_id)
        admission = not self.holds_kv(request_id)
        if admission and self.reserve_full_sequence and not self.can_allocate(
                request_id, self.requests[request_id].num_tokens):
            return 0  # vLLM admits only a request whose whole sequence fits
        hit = self.hits.get(request_id) if admission else None
        if hit is not None:
            blocks = hit.blocks.blocks[0]
            held = len(blocks)
            free -= sum(1 for block in blocks if block.ref_cnt == 0)
        return (held + max(0, free)) * self.block_size

    def can_allocate(self, request_id: str, num_total_tokens: int) -> bool:
        need = self.num_new_blocks_needed(request_id, num_total_tokens)
        return need <= self.num_free_blocks_for(request_id)

    def allocate_slots(self, request_id: str, num_total_tokens: int) -> list[int] | None:
        """vLLM's `allocate_slots` for the request to cover `num_total_tokens` (an
        admission adopts its prefix hit); the new block ids, or None if they do not fit."""
        req = self.requests[request_id]
        admission = not self.holds_kv(request_id)
        hit = self.hits.get(request_id) if admission else None
        computed = req.num_computed_tokens + (hit.num_tokens if hit is not None else 0)
        new_blocks = self.manager.allocate_slots(
            req, num_total_tokens - computed,
            num_new_computed_tokens=hit.num_tokens if hit is not None else 0,
            new_computed_blocks=hit.blocks if hit is not None else None,
            full_sequence_must_fit=admission and self.reserve_full_sequence,
            has_scheduled_reqs=True)
        if new_blocks is None:
            return None
        self.new_blocks[request_id] = new_blocks
        return list(new_blocks.get_block_ids()[0])

    def free(self, request_id: str, *, resumes: bool = False) -> int:
        """Preempt the running request by recompute, as vLLM does (its blocks freed;
        vLLM's own prefix cache keeps their content for its return, so `resumes` asks
        nothing more of it)."""
        held = self.num_device_blocks_of(request_id)
        self.preempter.preempt(request_id)
        return held

    # ---- run-ahead proofs (the simulator's; vLLM steps every step) --------------------
    def registers_more(self, request_ids: Iterable[str]) -> bool:
        """Always "may": vLLM's prefix cache is not followed here, so no run of steps is
        proven to admit nobody (StepPlan.admits_none_of is then False)."""
        return True

    def refuses_for_now(self, request_id: str, num_total_tokens: int) -> bool:
        return False  # not sure (see registers_more)

    def hit_is_settled(self, request_id: str) -> bool:
        return False  # not followed (see registers_more)

    # ---- no host tier in vLLM v1 ----------------------------------------------------
    def can_swap_out(self, request_id: str) -> bool:
        return False

    def can_swap_in(self, request_id: str, num_extra_blocks: int = 0) -> bool:
        return False

    def swap_out(self, request_id: str) -> list[tuple[int, int]]:
        raise ValueError("vLLM v1 has no KV swap: preempt by recompute")

    def swap_in(self, request_id: str) -> list[tuple[int, int]]:
        raise ValueError("vLLM v1 has no KV swap")

    def end_step(self) -> None:
        return None
