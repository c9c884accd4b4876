"""Paged KV cache tensors: one preallocated pool per tier, and swapping between them.

Design note. vLLM's PagedAttention (Kwon et al., SOSP'23, §4.1-4.5) stores KV in
fixed-size blocks addressed through per-request block tables. Here each tier is one
tensor [layers, 2 * kv_heads, blocks, block_size, head_dim]: K heads first, then V
heads, so a layer's new K and V are written with one `index_copy_` each along the slot
dimension and a request's blocks are read with one `index_select` that already yields
the [heads, seq, dim] layout attention wants. The host tier is a separate tensor (on CPU
both live in RAM, but a swap really copies every byte of the request's blocks, as a GPU
swap over PCIe would); `swap` returns the seconds the copies took.
"""

from __future__ import annotations

import time

import torch


class KVPools:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                 num_device_blocks: int, num_host_blocks: int, dtype: torch.dtype) -> None:
        if num_device_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_device_blocks}")
        if num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {num_host_blocks}")
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.num_host_blocks = num_host_blocks
        self.head_dim = head_dim
        self.dtype = dtype
        self._shape = (num_layers, 2 * num_kv_heads)
        self.released = False
        self._allocate(num_device_blocks, num_host_blocks)

    def _allocate(self, num_device_blocks: int, num_host_blocks: int) -> None:
        shape, block_size, head_dim = self._shape, self.block_size, self.head_dim
        # zeros (not empty): masked padding slots are multiplied by 0 and must be finite.
        self.device = torch.zeros(*shape, num_device_blocks, block_size, head_dim,
                                  dtype=self.dtype)
        self.host = torch.zeros(*shape, num_host_blocks, block_size, head_dim, dtype=self.dtype)
        self._flat = self.device.view(*shape, num_device_blocks * block_size, head_dim)

    def release(self) -> None:
        """Drop both tiers' tensors (their contents are lost); zero-block placeholders
        stand in until `restore`. The block counts stay: the block manager's view."""
        self._allocate(0, 0)
        self.released = True

    def restore(self) -> None:
        """Allocate both tiers again, zeroed, at their original sizes."""
        if self.released:
            self._allocate(self.num_device_blocks, self.num_host_blocks)
            self.released = False

    def layer(self, index: int) -> torch.Tensor:
        """Layer `index`'s device pool, [2 * kv_heads, blocks, block_size, head_dim]."""
        return self.device[index]

    def layer_slots(self, index: int) -> torch.Tensor:
        """The same pool addressed by slot, [2 * kv_heads, blocks * block_size, head_dim]."""
        return self._flat[index]

    @staticmethod
    def _copy(src: torch.Tensor, dst: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        src_ids = torch.tensor([s for s, _ in pairs], dtype=torch.long)
        dst_ids = torch.tensor([d for _, d in pairs], dtype=torch.long)
        dst.index_copy_(2, dst_ids, src.index_select(2, src_ids))

    def swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> float:
        """Copy (device, host) pairs out, then (host, device) pairs in; seconds taken."""
        if not swap_out and not swap_in:
            return 0.0
        started = time.perf_counter()
        if swap_out:
            self._copy(self.device, self.host, swap_out)
        if swap_in:
            self._copy(self.host, self.device, swap_in)
        return time.perf_counter() - started
