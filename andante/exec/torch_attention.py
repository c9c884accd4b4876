"""Attention over the paged KV cache for one layer of one fused step.

Design note. Every kind of row goes through PyTorch's fused CPU attention kernel,
`scaled_dot_product_attention` (a flash-attention loop: tiled QK^T, online softmax in
float32 and PV with no [queries, keys] matrix in memory), with grouped-query attention
done by the kernel (`enable_gqa`), so K/V are never replicated per query head:

* decode rows (one query each) gather their blocks with one `index_select` of the
  padded block table (PagedAttention's block table, Kwon et al. SOSP'23 §4.1) and run as
  one batched call, the padding masked by the step's additive mask;
* fresh prompts of equal length (one group) run as one causal call over their own new
  K/V, straight from the QKV projection;
* a chunk after a cached prefix (Sarathi-Serve's chunked prefill, Agrawal et al.
  OSDI'24 §4; or a prefix-cache hit) gathers its blocks and runs with a bottom-right
  causal boolean mask built once per step.

Measured on this CPU (one thread, CPU time per layer, bf16), against the earlier
hand-written path (baddbmm + softmax + bmm per KV head, prefill queries in chunks of
128 rows): decode 65 -> 24 us at batch 1, 179 -> 116 us at batch 8, 402 -> 284 us at
batch 16; a fresh 256-token prompt 868 -> 502 us; 8 prompts of 128 tokens 3.7 -> 1.4 ms;
a 256-token chunk after 1,000 cached tokens 7.1 -> 3.0 ms.

Blocks are gathered as rows of the layer's pool flattened to [2 kvh * blocks, bs * D]
(`gather_blocks`): torch parallelises `index_select` over dimension 0 but runs it on
one thread over any other dimension, so gathering along the block dimension of the
[2 kvh, blocks, bs, D] pool left the decode gather serial: at batch 16 and context 170
it took 175 us per layer on one thread and on two; as rows, 63 us on two (same bytes,
same result). Keeping the decode rows' K/V contiguous across steps instead (a
persistent buffer appended one token per step) was tried and dropped: it saved the
gather's 7 ms per batch-16 step (one thread) but attention then read a larger, colder
buffer and took 4 ms more; a fresh gather leaves its output in cache for the kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from andante.exec.torch_inputs import PrefillGroup, StepInputs


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          causal: bool, scale: float | None) -> torch.Tensor:
    """q [N, heads, Lq, D], k/v [N, kv_heads, Lk, D] -> [N, heads, Lq, D].
    `scale` None: q is already scaled (folded into W_q)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          scale=1.0 if scale is None else scale,
                                          enable_gqa=True)


def gather_blocks(pool: torch.Tensor, blocks: torch.Tensor,
                  inputs: StepInputs) -> torch.Tensor:
    """`pool.index_select(1, blocks)`, [2 kvh, len(blocks), bs, D], as one parallel
    row gather; the row indices are built once per step and pool size."""
    heads, num_blocks = pool.shape[0], pool.shape[1]
    rows = flat_rows(inputs, blocks, heads, num_blocks)
    out = pool.view(heads * num_blocks, -1).index_select(0, rows)
    return out.view(heads, blocks.numel(), *pool.shape[2:])


def flat_rows(inputs: StepInputs, index: torch.Tensor, heads: int,
              per_head: int) -> torch.Tensor:
    """`index` into each of `heads` slices of `per_head` rows, as rows of the flattened
    tensor: [heads * len(index)], head-major; built once per step and size."""
    key = (id(index), per_head)
    rows = inputs.gather_rows.get(key)
    if rows is None:
        offsets = torch.arange(0, heads * per_head, per_head).unsqueeze(1)
        rows = inputs.gather_rows[key] = (offsets + index).flatten()
    return rows


def write_kv(slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             inputs: StepInputs) -> None:
    """Write the step's new K/V [T, kvh, D] to their slots of the layer's pool addressed
    by slot ([2 kvh, blocks * bs, D]) as one row copy (37% less CPU time than copying
    along the slot dimension at 2,048 tokens, the same at 16)."""
    heads, per_head, dim = slots.shape
    rows = flat_rows(inputs, inputs.slots, heads, per_head)
    new = torch.cat((k.transpose(0, 1), v.transpose(0, 1)))
    slots.view(heads * per_head, dim).index_copy_(0, rows, new.view(-1, dim))


def decode_attention(q: torch.Tensor, pool: torch.Tensor, inputs: StepInputs,
                     num_kv_heads: int, scale: float | None) -> torch.Tensor:
    """q [B, heads, D] -> [B, heads * D]; `pool` is the layer's [2 kvh, blocks, bs, D]."""
    assert inputs.decode_blocks is not None and inputs.decode_mask is not None
    batch, heads, dim = q.shape
    kv = gather_blocks(pool, inputs.decode_blocks, inputs).view(2, num_kv_heads, batch, -1, dim)
    out = _sdpa(q.unsqueeze(2), kv[0].transpose(0, 1), kv[1].transpose(0, 1),
                inputs.decode_mask, False, scale)  # [B, heads, 1, D]
    return out.view(batch, heads * dim)


def prefill_attention(group: PrefillGroup, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, pool: torch.Tensor, inputs: StepInputs,
                      num_kv_heads: int, scale: float | None) -> torch.Tensor:
    """q [n*c, heads, D], k/v [n*c, kvh, D] of the group's rows -> [n*c, heads * D]."""
    n, c = group.num_seqs, group.num_tokens
    heads, dim = q.shape[1], q.shape[2]
    queries = q.view(n, c, heads, dim).transpose(1, 2)
    if group.blocks is None:  # fresh prompts: their own K/V, causal
        keys = k.view(n, c, num_kv_heads, dim).transpose(1, 2)
        values = v.view(n, c, num_kv_heads, dim).transpose(1, 2)
        out = _sdpa(queries, keys, values, None, True, scale)
    else:  # one sequence after a cached prefix: its blocks, bottom-right causal
        length = group.num_cached + c
        kv = gather_blocks(pool, group.blocks, inputs).view(2, num_kv_heads, -1, dim)[:, :, :length]
        out = _sdpa(queries, kv[0].unsqueeze(0), kv[1].unsqueeze(0), group.mask, False, scale)
    return out.transpose(1, 2).reshape(n * c, heads * dim)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor,
              inputs: StepInputs, num_kv_heads: int, scale: float | None) -> torch.Tensor:
    """All rows of the step: decode rows first, then each prefill group."""
    parts: list[torch.Tensor] = []
    nd = inputs.num_decode
    if nd:
        parts.append(decode_attention(q[:nd], pool, inputs, num_kv_heads, scale))
    for group in inputs.prefill_groups:
        rows = slice(group.start, group.start + group.num_seqs * group.num_tokens)
        parts.append(prefill_attention(group, q[rows], k[rows], v[rows], pool, inputs,
                                       num_kv_heads, scale))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
