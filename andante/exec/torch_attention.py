"""Attention over the paged KV cache for one layer of one fused step.

Design note. Grouped-query attention never replicates K/V: the G = heads / kv_heads
query heads that share a KV head are folded into the query rows, so one `baddbmm`
(adding the mask), a softmax and one `bmm` per KV head do the work. Decode rows (one
query each) gather their blocks with one `index_select` of the padded block table into
[kv_heads * batch, context, dim] and run all requests at once (CPU SDPA is several times
slower at a query length of G). Prefill segments use the same three kernels: fresh
prompts read their own new K/V (equal-length prompts batched), a chunk after a cached
prefix (Sarathi-Serve's chunked prefill) reads its blocks from the cache; queries go in
chunks of 128 rows, each reading keys only up to its causal horizon, so most of the
masked upper triangle is never computed. On this CPU that beats the flash-attention
kernel behind `scaled_dot_product_attention` by 1.5-2x.
"""

from __future__ import annotations

import torch

from andante.exec.torch_inputs import PrefillGroup, StepInputs


def decode_attention(q: torch.Tensor, pool: torch.Tensor, inputs: StepInputs,
                     num_kv_heads: int, scale: float | None) -> torch.Tensor:
    """q [B, heads, D] -> [B, heads * D]; `pool` is the layer's [2 kvh, blocks, bs, D].

    `scale` None: q is already scaled (folded into W_q)."""
    assert inputs.decode_blocks is not None and inputs.decode_mask is not None
    batch, heads, dim = q.shape
    group = heads // num_kv_heads
    rows = num_kv_heads * batch
    if scale is not None:
        q = q * scale
    q = q.view(batch, num_kv_heads, group, dim).transpose(0, 1).reshape(rows, group, dim)
    kv = pool.index_select(1, inputs.decode_blocks).view(2 * rows, -1, dim)
    scores = torch.baddbmm(inputs.decode_mask, q, kv[:rows].transpose(1, 2))  # [rows, G, L]
    out = torch.bmm(torch.softmax(scores, dim=-1), kv[rows:])  # [kvh * B, G, D]
    return out.view(num_kv_heads, batch, group, dim).transpose(0, 1).reshape(batch, heads * dim)


def _fold(x: torch.Tensor, n: int, c: int, kv_heads: int) -> torch.Tensor:
    """[n*c, kvh * G, D] rows -> [n * kvh, c * G, D] (token-major, then the G heads)."""
    dim = x.shape[-1]
    return x.view(n, c, kv_heads, -1, dim).transpose(1, 2).reshape(n * kv_heads, -1, dim)


def prefill_attention(group: PrefillGroup, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, pool: torch.Tensor, num_kv_heads: int,
                      scale: float | None) -> torch.Tensor:
    """q [n*c, heads, D], k/v [n*c, kvh, D] of the group's rows -> [n*c, heads * D]."""
    n, c = group.num_seqs, group.num_tokens
    heads, dim = q.shape[1], q.shape[2]
    queries = _fold(q if scale is None else q * scale, n, c, num_kv_heads)
    if group.blocks is None:
        keys, values = _fold(k, n, c, num_kv_heads), _fold(v, n, c, num_kv_heads)
    else:
        kv = pool.index_select(1, group.blocks).view(2 * num_kv_heads, -1, dim)
        keys, values = kv[:num_kv_heads], kv[num_kv_heads:]
    g = heads // num_kv_heads
    parts = []
    for chunk in group.chunks:
        rows = queries[:, chunk.start * g:chunk.end * g]
        keys_t = keys[:, :chunk.num_keys].transpose(1, 2)
        width = chunk.end - chunk.start
        if width == chunk.num_keys:  # the whole context is the diagonal block
            scores = torch.baddbmm(chunk.mask, rows, keys_t)
        else:
            scores = torch.bmm(rows, keys_t)
            scores[:, :, chunk.num_keys - width:] += chunk.mask
        parts.append(torch.bmm(torch.softmax(scores, dim=-1), values[:, :chunk.num_keys]))
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # [n*kvh, c*G, D]
    return out.view(n, num_kv_heads, c, g * dim).transpose(1, 2).reshape(n * c, heads * dim)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor,
              inputs: StepInputs, num_kv_heads: int, scale: float | None) -> torch.Tensor:
    """All rows of the step: decode rows first, then each prefill group."""
    parts: list[torch.Tensor] = []
    nd = inputs.num_decode
    if nd:
        parts.append(decode_attention(q[:nd], pool, inputs, num_kv_heads, scale))
    for group in inputs.prefill_groups:
        rows = slice(group.start, group.start + group.num_seqs * group.num_tokens)
        parts.append(prefill_attention(group, q[rows], k[rows], v[rows], pool, num_kv_heads,
                                       scale))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
