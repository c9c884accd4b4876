"""Moving KV between the members of a pipeline group (KunServe §4.2 and §4.4).

Design note. When a group forms, each running request's KV for the layers a member
dropped must reach the member now holding them (the block moves come from
andante.cluster.kunserve.adopt). The paper's coordinated exchange sends KV in chunks
sized like one pipeline stage's work and checks for activation transfers after each
chunk, sending those first. On one CPU process the activations of a step are handed
from stage to stage inside `PipelineExecutor.execute`, so "activations first" means:
KV chunks are copied between steps, at most `budget_bytes` after a step that ran a
batch, and without bound when nothing ran (nothing is waiting for the link). A request
stays out of the schedules until its last chunk has arrived (the paper's stall); other
requests keep running. A chunk is one request's blocks, for one source member, one
destination member and one run of layers; moves within one member (its new block ids)
are copied the same way but counted apart, as they cross no link.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch


class BlockMove(Protocol):
    """Copy the KV of layers [layers[0], layers[1]) of one block from one member to
    another (`andante.cluster.kunserve.adopt.KVMove` is one)."""

    @property
    def request_id(self) -> str: ...

    @property
    def src_member(self) -> int: ...

    @property
    def src_block(self) -> int: ...

    @property
    def dst_member(self) -> int: ...

    @property
    def dst_block(self) -> int: ...

    @property
    def layers(self) -> tuple[int, int]: ...


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


@dataclass(slots=True)
class _Chunk:
    request_id: str
    src_member: int
    dst_member: int
    layers: tuple[int, int]
    src_blocks: list[int] = field(default_factory=list)
    dst_blocks: list[int] = field(default_factory=list)


def _chunks(moves: Iterable[BlockMove], chunk_blocks: int) -> list[_Chunk]:
    """Moves grouped per (request, source, destination, layers), in request order, cut
    into chunks of at most `chunk_blocks` blocks."""
    runs: dict[tuple[str, int, int, tuple[int, int]], _Chunk] = {}
    for m in moves:
        key = (m.request_id, m.src_member, m.dst_member, m.layers)
        run = runs.get(key)
        if run is None:
            run = runs[key] = _Chunk(m.request_id, m.src_member, m.dst_member, m.layers)
        run.src_blocks.append(m.src_block)
        run.dst_blocks.append(m.dst_block)
    chunks: list[_Chunk] = []
    for run in runs.values():
        for i in range(0, len(run.src_blocks), chunk_blocks):
            chunks.append(_Chunk(run.request_id, run.src_member, run.dst_member, run.layers,
                                 run.src_blocks[i:i + chunk_blocks],
                                 run.dst_blocks[i:i + chunk_blocks]))
    return chunks


class KVExchange:
    """The pending block moves of one group formation, copied chunk by chunk (see the
    module note). `sources` / `targets`: each member's pools before / after."""

    def __init__(self, moves: Iterable[BlockMove], sources: Mapping[int, LayerPool],
                 targets: Mapping[int, LayerPool], chunk_blocks: int = 16) -> None:
        if chunk_blocks < 1:
            raise ValueError(f"chunk_blocks must be >= 1, got {chunk_blocks}")
        self._sources, self._targets = dict(sources), dict(targets)
        self._queue = deque(_chunks(moves, chunk_blocks))
        self._left = Counter(c.request_id for c in self._queue)
        self.bytes_exchanged = 0  # between members (over the link)
        self.bytes_local = 0  # within a member
        self.num_chunks = 0
        self.seconds = 0.0

    @property
    def done(self) -> bool:
        return not self._queue

    def pending_ids(self) -> list[str]:
        return list(self._left)

    def run(self, budget_bytes: int | None, is_live: Callable[[str], bool]) -> list[str]:
        """Copy chunks in order until `budget_bytes` are spent (None: all; at least one
        chunk either way); a request that `is_live` says is gone (finished, aborted)
        loses its chunks. Returns the requests whose KV is now complete."""
        started = time.perf_counter()
        spent = 0
        complete: list[str] = []
        while self._queue and (budget_bytes is None or spent < budget_bytes or not spent):
            chunk = self._queue.popleft()
            rid = chunk.request_id
            if is_live(rid):
                spent += self._copy(chunk)
            self._left[rid] -= 1
            if not self._left[rid]:
                del self._left[rid]
                if is_live(rid):
                    complete.append(rid)
        if self.done:
            self._sources.clear()  # the old pools may go now
        self.seconds += time.perf_counter() - started
        return complete

    def _copy(self, chunk: _Chunk) -> int:
        copied = copy_blocks(self._sources[chunk.src_member], self._targets[chunk.dst_member],
                             chunk.layers, chunk.src_blocks, chunk.dst_blocks)
        if chunk.src_member == chunk.dst_member:
            self.bytes_local += copied
        else:
            self.bytes_exchanged += copied
        self.num_chunks += 1
        return copied
