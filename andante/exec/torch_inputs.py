"""Flatten one `StepBatch` into the tensors a fused forward pass needs.

Design note. Every scheduled token of the step becomes one row of a single [T, hidden]
activation (Orca's iteration-level batching, Yu et al. OSDI'22; Sarathi-Serve's mixed
prefill/decode batches, Agrawal et al. OSDI'24), so each weight matrix is streamed once
per step whatever the mix. Rows are ordered decode rows first (every request advancing
by one token), then prefill segments sorted so that fresh prompts of equal length are
adjacent: attention then needs one call for all decodes, one per group of equal fresh
prompts, and one per chunk that continues a cached prefix. Block tables, the slot each
new token's KV goes to, and the decode padding mask are built here once per step and
shared by all layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from andante.core.request import Request
from andante.exec.batch import StepBatch

if TYPE_CHECKING:
    from andante.exec.torch_attention import AttentionPlan


@dataclass(slots=True)
class PrefillGroup:
    """Rows [start, start + num_seqs * num_tokens) of the step: `num_seqs` sequences of
    `num_tokens` new tokens each, after `num_cached` cached ones. Fresh prompts
    (`blocks is None`, num_cached 0) attend causally to their own new K/V; a chunk after
    a cached prefix (one sequence) reads its `blocks` from the cache under `mask`
    [num_tokens, num_cached + num_tokens], additive in the model dtype (0 where visible:
    the prefix and the causal lower triangle of its own tokens; -inf elsewhere)."""

    start: int
    num_seqs: int
    num_tokens: int
    num_cached: int = 0
    blocks: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] flat KV slot of each new token
    num_decode: int
    decode_blocks: torch.Tensor | None  # [num_decode * max_blocks]
    decode_mask: torch.Tensor | None  # [num_decode, 1, 1, max_blocks * block_size]
    # in the model dtype: 0 where visible, -inf on padding (added to the scores)
    prefill_groups: list[PrefillGroup]
    sample_rows: torch.Tensor  # rows whose logits are sampled
    sample_index: list[int]  # batch index of each sampled row
    # the step's attention plan per pool size (number of blocks): built by the first
    # layer that attends, reused by the others (andante.exec.torch_attention)
    plans: dict[int, AttentionPlan] = field(default_factory=dict)
    decode_matmul: bool = False  # the executor's decode attention path (torch_attention)
    decode_native: bool = False  # ... its matmuls in the model dtype
    prefill_matmul: bool = False  # its prefill groups' attention path (torch_attention)
    decode_threads: int = 0  # decode attention's thread count (0: the step's; thread_scope)


def token_slice(req: Request, start: int, end: int) -> list[int]:
    """Token ids at positions [start, end) of prompt + output."""
    num_prompt = req.num_prompt_tokens
    if end <= num_prompt:
        return list(req.prompt_token_ids[start:end])
    out = req.output_token_ids
    if start >= num_prompt:
        return out[start - num_prompt:end - num_prompt]
    return [*req.prompt_token_ids[start:], *out[:end - num_prompt]]


def _slots(table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    return [table[p // block_size] * block_size + p % block_size for p in range(start, end)]


class InputBuilder:
    def __init__(self, block_size: int, max_len: int, num_kv_heads: int, group_size: int,
                 dtype: torch.dtype) -> None:
        self.block_size = block_size
        self.max_len = max_len
        self.num_kv_heads = num_kv_heads
        self.group_size = group_size
        self.dtype = dtype
        self.decode_matmul = False  # set by the executor's start-up choice
        self.decode_native = False  # likewise
        self.prefill_matmul = False
        # decode batches below this size attend on one thread (andante.exec.thread_scope)
        self.decode_one_thread_below = 0

    def copy_attention_paths(self, other: InputBuilder) -> None:
        """Take `other`'s attention paths (a pipeline of an executor's layers)."""
        self.decode_matmul = other.decode_matmul
        self.decode_native = other.decode_native
        self.prefill_matmul = other.prefill_matmul
        self.decode_one_thread_below = other.decode_one_thread_below

    def build(self, batch: StepBatch) -> StepInputs:
        n_new, n_cached = batch.num_new_tokens, batch.num_cached_tokens
        for i, req in enumerate(batch.requests):
            if n_cached[i] + n_new[i] > self.max_len:
                raise ValueError(f"request {req.request_id!r} reaches position "
                                 f"{n_cached[i] + n_new[i]}; the executor's limit is "
                                 f"{self.max_len}")
        decodes = [i for i, n in enumerate(n_new) if n == 1]
        prefills = sorted((i for i, n in enumerate(n_new) if n > 1),
                          key=lambda i: (n_cached[i] > 0, n_new[i]))
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        rows = [0] * len(n_new)  # last row of each request
        for i in (*decodes, *prefills):
            start, end = n_cached[i], n_cached[i] + n_new[i]
            ids += token_slice(batch.requests[i], start, end)
            positions += range(start, end)
            slots += _slots(batch.block_tables[i], start, end, self.block_size)
            rows[i] = len(ids) - 1
        sampled = [i for i, s in enumerate(batch.samples) if s]
        decode_blocks, decode_mask = self._decode_tables(batch, decodes)
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            num_decode=len(decodes), decode_blocks=decode_blocks, decode_mask=decode_mask,
            prefill_groups=self._prefill_groups(batch, prefills, len(decodes)),
            sample_rows=torch.tensor([rows[i] for i in sampled], dtype=torch.long),
            sample_index=sampled, decode_matmul=self.decode_matmul,
            decode_native=self.decode_native, prefill_matmul=self.prefill_matmul,
            decode_threads=1 if len(decodes) < self.decode_one_thread_below else 0,
        )

    def _decode_tables(self, batch: StepBatch, decodes: list[int]
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not decodes:
            return None, None
        bs = self.block_size
        lengths = [batch.num_cached_tokens[i] + 1 for i in decodes]
        max_blocks = -(-max(lengths) // bs)
        flat: list[int] = []
        for i, length in zip(decodes, lengths, strict=True):
            table = batch.block_tables[i]
            used = -(-length // bs)
            flat += table[:used]
            flat += [table[0]] * (max_blocks - used)  # padding, masked out
        context = torch.arange(max_blocks * bs)
        visible = context[None, :] < torch.tensor(lengths)[:, None]
        mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, float("-inf"))
        return torch.tensor(flat, dtype=torch.long), mask.view(len(decodes), 1, 1, -1)

    def _prefill_groups(self, batch: StepBatch, prefills: list[int],
                        first_row: int) -> list[PrefillGroup]:
        groups: list[PrefillGroup] = []
        row = first_row
        for i in prefills:
            n, cached = batch.num_new_tokens[i], batch.num_cached_tokens[i]
            last = groups[-1] if groups else None
            if (cached == 0 and last is not None and last.blocks is None
                    and last.num_tokens == n):
                last.num_seqs += 1
            else:
                groups.append(self._group(batch.block_tables[i], row, n, cached))
            row += n
        return groups

    def _group(self, table: list[int], row: int, n: int, cached: int) -> PrefillGroup:
        if not cached:
            return PrefillGroup(row, 1, n)
        used = -(-(cached + n) // self.block_size)
        blocks = torch.tensor(table[:used], dtype=torch.long)
        # additive, in the model dtype: SDPA would convert a boolean mask in every layer
        hidden = torch.ones(n, cached + n, dtype=torch.bool).triu_(cached + 1)
        mask = torch.zeros(n, cached + n, dtype=self.dtype).masked_fill_(hidden, float("-inf"))
        return PrefillGroup(row, 1, n, cached, blocks, mask)
