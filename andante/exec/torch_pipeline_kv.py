"""Copying KV blocks between the layer pools of a pipeline group's members (KunServe
§4.2 and §4.4).

Design note. A member's device KV for its slice of layers is one tensor (a `LayerPool`);
`copy_blocks` copies some layers of some blocks from one pool into another, the one
operation KunServe's KV exchange needs on the real engine. Which blocks move, in which
chunks and in which order is andante.cluster.kunserve.exchange's schedule (carried out
by andante.runtime.kunserve_stages' `KVExchange`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class LayerPool:
    """One member's device KV of layers [first_layer, first_layer + len(tensor)),
    tensor [layers, 2 * kv_heads, blocks, block_size, head_dim]."""

    tensor: torch.Tensor
    first_layer: int = 0

    def layers(self, start: int, end: int) -> torch.Tensor:
        return self.tensor[start - self.first_layer:end - self.first_layer]


def copy_blocks(src: LayerPool, dst: LayerPool, layers: tuple[int, int],
                src_blocks: list[int], dst_blocks: list[int]) -> int:
    """Copy `layers` of `src_blocks` into `dst_blocks`; returns the bytes copied."""
    if not src_blocks:
        return 0
    source = src.layers(*layers).index_select(2, torch.tensor(src_blocks, dtype=torch.long))
    dst.layers(*layers).index_copy_(2, torch.tensor(dst_blocks, dtype=torch.long), source)
    return source.numel() * source.element_size()
