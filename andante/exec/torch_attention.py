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
  causal mask built once per step (additive in the model dtype: SDPA would convert a
  boolean one in every layer).

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

Which kernel is faster for decode rows depends on the CPU: the fused kernel's bf16
path is brgemm tiles where the CPU has AMX, a generic per-tile loop elsewhere. On an
AVX-512 BF16 CPU without AMX (issue 32; one thread, process CPU time per layer, context
144, load 12-15) it took 118 / 920 / 1,835 us at batch 1 / 8 / 16, while the same
arithmetic as two float32 batched matmuls and a softmax (`decode_attention_matmul`)
took 35 / 292 / 701 us, within one bf16 rounding of the kernel's output (the kernel also
computes in float32). So the executor times both at start-up on its own shapes and
uses the faster (`choose_decode_path`; the step's `decode_matmul`). A third path runs
those matmuls in the model dtype (`native`: oneDNN's bf16 GEMMs, no float32 copy of the
gathered K/V; the scores and probabilities rounded to bf16 as the prefill path below
does): one thread, thread CPU per layer call, context 128, load 11-14: 41 -> 62 us at
batch 1, 206 -> 154 us at batch 8, 367 -> 213 us at batch 16; a whole decode step
(process CPU, SmolLM2, same executor, interleaved) 25.5 -> 24.6 ms at batch 8 and 37.0
-> 34.3 ms at batch 16 on one thread. But those are warm shapes: oneDNN builds (and
JIT-compiles) a bf16 matmul primitive per new shape, 0.37 ms for the first call of a
batch-8 decode shape against 0.05 ms after (MKL's float32 matmuls have no such setup,
0.05 vs 0.04 ms), and a server's decode shapes change with every batch size and every
block of context, each new one also taking entries of the primitive cache sized for the
step buckets (andante.perf.step_sizes). So "auto" chooses between the kernel and the
float32 matmuls only; `matmul_native` is there when asked for. With more than one
thread, decode attention of small batches may run on one thread while the step's GEMMs
keep all of them (`decode_threads_choice`, timed at start-up; andante.exec.thread_scope
says why: each of its ~5 kernels per layer would otherwise open an OpenMP region).

Fresh prompts meet the same CPU question. Without AMX the fused kernel's bf16 prefill
took about 2.1 ms per layer for a 256-token prompt (one thread, thread CPU time; 60 ms
of a 30-layer prefill, for ~4% of its FLOPs), while oneDNN's bf16 batched GEMMs run the
same products at the dense projections' rate. So `prefill_attention_matmul` computes
it as batched matmuls in the model dtype: each KV head's query group stacked into one
GEMM (GQA without replicating K/V), PREFILL_BLOCK query rows at a time so a block
scores only the keys up to its own last row (the causal half is skipped block-wise and
the [T, T] scores are never whole; PREFILL_BLOCK is 256, not 128: each block opens about
eight OpenMP regions at two threads, each a wake-up of the sleeping worker under
andante's PASSIVE wait, andante.exec.omp_wait, which costs more than the masked upper
half of a 256-row block computes: ~2% of a layer's FLOPs), an additive mask on the
diagonal block only (built once per dtype, `shared_causal_block`), and a
softmax that computes in float32 and rounds the probabilities once, as the kernel does
before its value GEMM. The scores are rounded to bf16 before the softmax (the kernel
keeps them in float32); measured on SmolLM2 (four 256-token prompts of this README,
relative L2 of the last logits from float32's) that is not worse overall: 1.54 / 5.22 /
0.58 / 1.00% by the kernel, 1.09 / 1.39 / 0.36 / 0.44% by the matmuls (greedy
agreement with float32 over 12 prompts x 24 tokens, tokens before the first divergence:
0.83 and 0.77; near-ties flip either way). A 256-token prefill step (process CPU,
benchmarks/prefill_step.py, load 10-13) took 244 -> 206 ms on one thread and 259 ->
226 ms on two; eight 128-token prompts 808 -> 737 ms. As for decode rows, the executor
times both paths at start-up (`choose_prefill_path`, bf16 only: float32 keeps the
kernel, whose arithmetic is transformers') and uses the faster; a chunk after a cached
prefix takes the same path over its gathered blocks (its blocks score the prefix and
their own causal part; the group's mask is then unused). The bf16 matmuls' oneDNN
primitives are built per shape (a bmm of a 256-token block's shape: 0.69 ms the first
time, 0.06 ms after): the full blocks' shapes recur for every prompt, a new prompt length
adds its last block's two (about 1.2 ms once, against ~40 ms of CPU the path saves on a
256-token prompt); those entries share oneDNN's primitive cache with the step buckets'
GEMMs, so a stream of distinct prompt lengths can evict bucket primitives (not
measured). Prompts of 24 distinct lengths in 161-208 tokens, each new to the path, two
threads, load 7-9: 194 -> 169 ms of process CPU and 392 -> 341 ms wall per prefill
step, the first and the second run of a length alike.

The functions here are TorchScript (`torch.jit.script`), so that the fused layer stack
(andante.exec.torch_layers) runs a whole step's layers in one scripted call; what they
need of the step is an `AttentionPlan` of plain tensors and ints, built once per step
and pool shape (`attention_plan`).
"""

# no `from __future__ import annotations`: TorchScript cannot resolve the postponed
# annotations of NamedTuples used inside lists
import functools
import statistics
import time
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from andante.exec import thread_scope  # noqa: F401 (registers torch.ops.andante.set_threads)
from andante.exec.torch_inputs import StepInputs
from andante.exec.torch_threads import all_threads_from
from andante.models.torchscript import script


class AttentionPlan(NamedTuple):
    """What attention needs of one step, for pools of one shape. Row indices address
    the layer's pool flattened to rows (`flat_rows`); `write_slots` are the new tokens'
    K/V slots ([T]); `decode_rows` the decode rows' padded block tables (empty
    without decodes) under `decode_mask`; group i covers rows [start, start + seqs *
    tokens) of the step after `cached` cached tokens, reading `group_rows[i]` (None for
    fresh prompts) under `group_masks[i]` (see andante.exec.torch_inputs.PrefillGroup)."""

    write_slots: torch.Tensor
    num_decode: int
    decode_rows: torch.Tensor
    decode_mask: torch.Tensor
    group_start: list[int]
    group_seqs: list[int]
    group_tokens: list[int]
    group_cached: list[int]
    group_rows: list[Optional[torch.Tensor]]  # noqa: UP045 (TorchScript needs Optional)
    group_masks: list[Optional[torch.Tensor]]  # noqa: UP045
    decode_matmul: bool  # decode rows by `decode_attention_matmul`
    decode_native: bool  # ... in the model dtype (its `native`)
    prefill_matmul: bool  # prefill groups by `prefill_attention_matmul`
    decode_threads: int  # decode rows' attention at this many threads (0: the step's)
    causal_block: torch.Tensor  # its additive causal mask, [PREFILL_BLOCK]*2 (or empty)


def flat_rows(index: torch.Tensor, heads: int, per_head: int) -> torch.Tensor:
    """`index` into each of `heads` slices of `per_head` rows, as rows of the flattened
    tensor: [heads * len(index)], head-major."""
    offsets = torch.arange(0, heads * per_head, per_head).unsqueeze(1)
    return (offsets + index).flatten()


_EMPTY = torch.empty(0)
#: Query rows per head that `prefill_attention_matmul` scores at once.
PREFILL_BLOCK = 256


def causal_block(size: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive causal mask of a diagonal block, [size, size]: 0 on and below the
    diagonal, -inf above."""
    return torch.full((size, size), float("-inf"), dtype=dtype).triu_(1)


@functools.cache
def shared_causal_block(dtype: torch.dtype) -> torch.Tensor:
    """`causal_block(PREFILL_BLOCK, dtype)`, built once per dtype (only ever read): at
    256 x 256 building it opens two OpenMP regions, once per step otherwise."""
    return causal_block(PREFILL_BLOCK, dtype)


def attention_plan(inputs: StepInputs, pool: torch.Tensor) -> AttentionPlan:
    """The step's plan for layer pools shaped like `pool` [2 kvh, blocks, bs, D]; built
    by the first layer that asks and reused by the others."""
    heads, blocks = pool.shape[0], pool.shape[1]
    plan = inputs.plans.get(blocks)
    if plan is not None:
        return plan
    groups = inputs.prefill_groups
    decode_rows = (_EMPTY if inputs.decode_blocks is None
                   else flat_rows(inputs.decode_blocks, heads, blocks))
    plan = inputs.plans[blocks] = AttentionPlan(
        inputs.slots, inputs.num_decode,
        decode_rows, _EMPTY if inputs.decode_mask is None else inputs.decode_mask,
        [g.start for g in groups], [g.num_seqs for g in groups],
        [g.num_tokens for g in groups], [g.num_cached for g in groups],
        [None if g.blocks is None else flat_rows(g.blocks, heads, blocks) for g in groups],
        [g.mask for g in groups], inputs.decode_matmul, inputs.decode_native,
        inputs.prefill_matmul, inputs.decode_threads,
        shared_causal_block(pool.dtype) if inputs.prefill_matmul and groups else _EMPTY)
    return plan


@script
def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
          causal: bool, scale: float | None) -> torch.Tensor:
    """q [N, heads, Lq, D], k/v [N, kv_heads, Lk, D] -> [N, heads, Lq, D].
    `scale` None: q is already scaled (folded into W_q)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          scale=1.0 if scale is None else scale,
                                          enable_gqa=True)


@script
def gather_blocks(pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The blocks whose pool rows are `rows` (`flat_rows` of a block list), as one
    parallel row gather: [2 kvh, len(blocks), bs, D]."""
    heads, num_blocks = pool.shape[0], pool.shape[1]
    out = pool.view(heads * num_blocks, -1).index_select(0, rows)
    return out.view(heads, -1, pool.shape[2], pool.shape[3])


@script
def write_kv(slots: torch.Tensor, kv: torch.Tensor, slot_ids: torch.Tensor) -> None:
    """Write the step's new K/V, `kv` [T, 2 kvh, D] (K heads then V heads: the QKV
    projection's rows after RoPE in place), to their slots of the layer's pool addressed
    by slot ([2 kvh, blocks * bs, D]): one copy straight from the strided view, so one
    OpenMP region per layer (two with K and V written apart; concatenating them first
    took 17% more time at 1,032 tokens)."""
    slots.index_copy_(1, slot_ids, kv.transpose(0, 1))


@script
def decode_attention(q: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor,
                     mask: torch.Tensor, num_kv_heads: int,
                     scale: float | None) -> torch.Tensor:
    """q [B, heads, D] -> [B, heads * D]; `pool` is the layer's [2 kvh, blocks, bs, D]."""
    batch, heads, dim = q.shape[0], q.shape[1], q.shape[2]
    kv = gather_blocks(pool, rows).view(2, num_kv_heads, batch, -1, dim)
    out = _sdpa(q.unsqueeze(2), kv[0].transpose(0, 1), kv[1].transpose(0, 1),
                mask, False, scale)  # [B, heads, 1, D]
    return out.view(batch, heads * dim)


@script
def decode_attention_matmul(q: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor,
                            mask: torch.Tensor, num_kv_heads: int,
                            scale: float | None, native: bool = False) -> torch.Tensor:
    """`decode_attention` as two float32 batched matmuls and a softmax (each KV head's
    query group against its keys): the same float32 arithmetic as the fused kernel's,
    with the output rounded to the model dtype once, in another order. The matmuls run
    in the gathered blocks' own head-major order ([kvh, B, L, D], the queries permuted
    to match), so no K/V is copied again after the gather and its float32 conversion.
    `native`: the same in the model dtype, no conversion (oneDNN's bf16 GEMMs; the
    scores and probabilities are rounded to bf16, the softmax computes in float32)."""
    batch, heads, dim = q.shape[0], q.shape[1], q.shape[2]
    group = heads // num_kv_heads
    kv = gather_blocks(pool, rows).view(2, num_kv_heads, batch, -1, dim)
    queries = q.view(batch, num_kv_heads, group, dim).transpose(0, 1)
    if not native:
        kv, queries = kv.float(), queries.float()
    scores = torch.matmul(queries, kv[0].transpose(2, 3))  # [kvh, B, group, L]
    if scale is not None:
        scores = scores * scale
    probs = (scores + mask.view(1, batch, 1, -1)).softmax(dim=-1)
    out = torch.matmul(probs, kv[1])  # [kvh, B, group, D]
    return out.transpose(0, 1).to(q.dtype).reshape(batch, heads * dim)


@script
def prefill_attention_matmul(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             n: int, c: int, cached: int, num_kv_heads: int,
                             causal: torch.Tensor, scale: float | None) -> torch.Tensor:
    """Causal attention of `n` sequences' `c` new tokens after `cached` earlier ones, as
    batched matmuls in the model dtype (each KV head's query group stacked into one
    GEMM) and a softmax, PREFILL_BLOCK query rows at a time: a block's queries score
    only the keys up to its own last row, and only its diagonal [b, b] part takes the
    additive `causal` mask ([PREFILL_BLOCK, PREFILL_BLOCK], `causal_block`). q [n*c,
    heads, D]; keys/values [n, kvh, >= cached + c, D] (head-major views) -> [n*c, heads
    * D]. The scores are rounded to the model dtype before the softmax (which computes
    in float32) and the probabilities before the value GEMM; see the module note."""
    heads, dim = q.shape[1], q.shape[2]
    group = heads // num_kv_heads
    nk = n * num_kv_heads
    queries = q.view(n, c, num_kv_heads, group, dim).permute(0, 2, 3, 1, 4)
    out = torch.empty(n, c, num_kv_heads, group, dim, dtype=q.dtype)
    blocks_out = out.permute(0, 2, 3, 1, 4)  # [n, kvh, group, c, D], out's memory
    block = causal.shape[0]
    for start in range(0, c, block):
        end = min(c, start + block)
        b, visible = end - start, cached + end
        scores = torch.matmul(queries[:, :, :, start:end].reshape(nk, group * b, dim),
                              keys[:, :, :visible].transpose(2, 3).reshape(nk, dim, visible))
        if scale is not None:
            scores = scores * scale
        scores = scores.view(nk, group, b, visible)
        # add_ writes the scores (a fresh matmul result), never `causal`: that block is
        # shared by every call and layer, and must never be written
        scores[:, :, :, cached + start:].add_(causal[:b, :b])
        probs = scores.softmax(dim=-1).view(nk, group * b, visible)
        part = torch.matmul(probs, values[:, :, :visible].reshape(nk, visible, dim))
        blocks_out[:, :, :, start:end] = part.view(n, num_kv_heads, group, b, dim)
    return out.view(n * c, heads * dim)


@script
def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      pool: torch.Tensor, n: int, c: int, cached: int,
                      rows: torch.Tensor | None, mask: torch.Tensor | None,
                      num_kv_heads: int, scale: float | None,
                      causal: torch.Tensor) -> torch.Tensor:
    """q [n*c, heads, D], k/v [n*c, kvh, D] of a group of `n` sequences of `c` new
    tokens after `cached` cached ones -> [n*c, heads * D]. By
    `prefill_attention_matmul` when `causal` (its block mask) is not empty, else by the
    fused kernel."""
    heads, dim = q.shape[1], q.shape[2]
    if causal.numel() > 0:
        if rows is None:  # fresh prompts: their own K/V
            keys = k.view(n, c, num_kv_heads, dim).transpose(1, 2)
            values = v.view(n, c, num_kv_heads, dim).transpose(1, 2)
            return prefill_attention_matmul(q, keys, values, n, c, 0, num_kv_heads,
                                            causal, scale)
        kv = gather_blocks(pool, rows).view(2, num_kv_heads, -1, dim)
        return prefill_attention_matmul(q, kv[0].unsqueeze(0), kv[1].unsqueeze(0), 1, c,
                                        cached, num_kv_heads, causal, scale)
    queries = q.view(n, c, heads, dim).transpose(1, 2)
    if rows is None:  # fresh prompts: their own K/V, causal
        keys = k.view(n, c, num_kv_heads, dim).transpose(1, 2)
        values = v.view(n, c, num_kv_heads, dim).transpose(1, 2)
        out = _sdpa(queries, keys, values, None, True, scale)
    else:  # one sequence after a cached prefix: its blocks, bottom-right causal
        kv = gather_blocks(pool, rows).view(2, num_kv_heads, -1, dim)[:, :, :cached + c]
        out = _sdpa(queries, kv[0].unsqueeze(0), kv[1].unsqueeze(0), mask, False, scale)
    return out.transpose(1, 2).reshape(n * c, heads * dim)


@script
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor,
              plan: AttentionPlan, num_kv_heads: int,
              scale: float | None) -> torch.Tensor:
    """All rows of the step: decode rows first, then each prefill group."""
    parts: list[torch.Tensor] = []
    nd = plan.num_decode
    if nd > 0:
        step_threads = 0  # the step's thread count, to restore (andante.exec.thread_scope)
        if plan.decode_threads > 0:
            step_threads = torch.ops.andante.set_threads(plan.decode_threads)
        if plan.decode_matmul:
            parts.append(decode_attention_matmul(q[:nd], pool, plan.decode_rows,
                                                 plan.decode_mask, num_kv_heads, scale,
                                                 plan.decode_native))
        else:
            parts.append(decode_attention(q[:nd], pool, plan.decode_rows,
                                          plan.decode_mask, num_kv_heads, scale))
        if step_threads > 0:
            torch.ops.andante.set_threads(step_threads)
    for i in range(len(plan.group_start)):
        start, n, c = plan.group_start[i], plan.group_seqs[i], plan.group_tokens[i]
        end = start + n * c
        parts.append(prefill_attention(q[start:end], k[start:end], v[start:end], pool, n, c,
                                       plan.group_cached[i], plan.group_rows[i],
                                       plan.group_masks[i], num_kv_heads, scale,
                                       plan.causal_block))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


#: Decode batches and context the start-up choice times both paths at.
CHOICE_BATCHES = (1, 8, 16)
CHOICE_CONTEXT = 128


DECODE_PATHS = ("sdpa", "matmul", "matmul_native")
AUTO_DECODE_PATHS = DECODE_PATHS[:2]  # what "auto" chooses from


def _native_decode(q: torch.Tensor, pool: torch.Tensor, rows: torch.Tensor,
                   mask: torch.Tensor, num_kv_heads: int, scale: float | None) -> torch.Tensor:
    return decode_attention_matmul(q, pool, rows, mask, num_kv_heads, scale, True)


def choose_decode_path(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                       block_size: int, rounds: int = 5, reps: int = 20,
                       paths: tuple[str, ...] = ("sdpa", "matmul")) -> dict[str, float]:
    """Time `paths` of DECODE_PATHS (`decode_attention`, the fused kernel;
    `decode_attention_matmul` in float32 or `native`ly) on random data of the model's
    shapes, at CHOICE_BATCHES x CHOICE_CONTEXT, interleaved rounds at the current thread
    count; the median microseconds per call of each, summed over the batch sizes:
    {"sdpa": us, "matmul": us, ...}."""
    blocks_per_seq = -(-(CHOICE_CONTEXT + 1) // block_size)
    every = {"sdpa": decode_attention, "matmul": decode_attention_matmul,
             "matmul_native": _native_decode}
    runs = {name: every[name] for name in paths}
    totals = dict.fromkeys(runs, 0.0)
    for batch in CHOICE_BATCHES:
        pool = torch.randn(2 * kv_heads, batch * blocks_per_seq, block_size, head_dim,
                           dtype=dtype)
        table = torch.arange(batch * blocks_per_seq)
        rows = flat_rows(table, 2 * kv_heads, batch * blocks_per_seq)
        mask = torch.zeros(batch, 1, 1, blocks_per_seq * block_size, dtype=dtype)
        mask[..., CHOICE_CONTEXT + 1:] = float("-inf")
        q = torch.randn(batch, heads, head_dim, dtype=dtype)
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds + 1):  # the first round warms up
            for name, fn in runs.items():
                started = time.perf_counter()
                for _ in range(reps):
                    fn(q, pool, rows, mask, kv_heads, None)
                samples[name].append((time.perf_counter() - started) / reps * 1e6)
        for name, times in samples.items():
            totals[name] += statistics.median(times[1:])
    return {name: round(us, 1) for name, us in totals.items()}


def choose_decode_threads(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                          block_size: int, path: str, num_threads: int, rounds: int = 5,
                          reps: int = 20) -> dict[int, tuple[float, float]]:
    """Time decode attention by `path` (of DECODE_PATHS) on one thread and on
    `num_threads`, at CHOICE_BATCHES x CHOICE_CONTEXT, interleaved rounds (as
    `choose_decode_path`): {batch: (median us on one thread, on num_threads)}. Leaves
    torch's thread count as it found it."""
    every = {"sdpa": decode_attention, "matmul": decode_attention_matmul,
             "matmul_native": _native_decode}
    fn = every[path]
    blocks_per_seq = -(-(CHOICE_CONTEXT + 1) // block_size)
    previous = torch.get_num_threads()
    out: dict[int, tuple[float, float]] = {}
    try:
        for batch in CHOICE_BATCHES:
            pool = torch.randn(2 * kv_heads, batch * blocks_per_seq, block_size, head_dim,
                               dtype=dtype)
            rows = flat_rows(torch.arange(batch * blocks_per_seq), 2 * kv_heads,
                             batch * blocks_per_seq)
            mask = torch.zeros(batch, 1, 1, blocks_per_seq * block_size, dtype=dtype)
            mask[..., CHOICE_CONTEXT + 1:] = float("-inf")
            q = torch.randn(batch, heads, head_dim, dtype=dtype)
            samples: dict[int, list[float]] = {1: [], num_threads: []}
            for _ in range(rounds + 1):  # the first round warms up
                for threads, times in samples.items():
                    torch.set_num_threads(threads)
                    started = time.perf_counter()
                    for _ in range(reps):
                        fn(q, pool, rows, mask, kv_heads, None)
                    times.append((time.perf_counter() - started) / reps * 1e6)
            out[batch] = (round(statistics.median(samples[1][1:]), 1),
                          round(statistics.median(samples[num_threads][1:]), 1))
    finally:
        torch.set_num_threads(previous)
    return out


def one_thread_below(timings: dict[int, tuple[float, float]]) -> int:
    """Decode batches below this size attend on one thread: the smallest timed batch
    from which all threads win at every larger timed batch (the smallest timed batch
    when all threads always win; past the largest when one thread wins there)."""
    return all_threads_from(timings, beyond=max(timings, default=0) + 1)


def decode_threads_choice(option: str, heads: int, kv_heads: int, head_dim: int,
                          dtype: torch.dtype, block_size: int, path: str,
                          num_threads: int) -> tuple[int, dict[int, tuple[float, float]]]:
    """Decode batches below the returned size run their attention on one thread
    (andante.exec.thread_scope): "one" all of them, "all" none, "auto" as timed now at
    `num_threads` (`choose_decode_threads`, `one_thread_below`); with the timings
    (empty when set, or with one thread to begin with)."""
    if option == "all" or num_threads <= 1:
        return 0, {}
    if option == "one":
        return 1 << 30, {}
    timings = choose_decode_threads(heads, kv_heads, head_dim, dtype, block_size, path,
                                    num_threads)
    return one_thread_below(timings), timings


def decode_path_choice(option: str, heads: int, kv_heads: int, head_dim: int,
                       dtype: torch.dtype, block_size: int) -> tuple[str, dict[str, float]]:
    """The decode rows' path of DECODE_PATHS: the option as set, or ("auto") the faster
    of "sdpa" and "matmul" timed now ("matmul_native" only when asked for: its oneDNN
    GEMMs pay a setup per new batch x context shape, see the module note). With the
    timings (empty when set)."""
    if option != "auto":
        return option, {}
    timings = choose_decode_path(heads, kv_heads, head_dim, dtype, block_size,
                                 paths=AUTO_DECODE_PATHS)
    return min(timings, key=lambda name: timings[name]), timings


#: Fresh prompts (sequences x tokens) the start-up choice times both prefill paths at.
PREFILL_CHOICE_SHAPES = ((1, 256), (4, 128))


def choose_prefill_path(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                        rounds: int = 3, reps: int = 3) -> dict[str, float]:
    """Time `prefill_attention` by the fused kernel and by `prefill_attention_matmul`
    on random data of the model's shapes at PREFILL_CHOICE_SHAPES, interleaved rounds at
    the current thread count; the median microseconds per call of each, summed over the
    shapes: {"sdpa": us, "matmul": us}."""
    totals = {"sdpa": 0.0, "matmul": 0.0}
    causal = causal_block(PREFILL_BLOCK, dtype)
    for n, c in PREFILL_CHOICE_SHAPES:
        q = torch.randn(n * c, heads, head_dim, dtype=dtype)
        k = torch.randn(n * c, kv_heads, head_dim, dtype=dtype)
        v = torch.randn(n * c, kv_heads, head_dim, dtype=dtype)
        masks = {"sdpa": _EMPTY, "matmul": causal}
        samples: dict[str, list[float]] = {name: [] for name in masks}
        for _ in range(rounds + 1):  # the first round warms up
            for name, mask in masks.items():
                started = time.perf_counter()
                for _ in range(reps):
                    prefill_attention(q, k, v, _EMPTY, n, c, 0, None, None, kv_heads, None,
                                      mask)
                samples[name].append((time.perf_counter() - started) / reps * 1e6)
        for name, times in samples.items():
            totals[name] += statistics.median(times[1:])
    return {name: round(us, 1) for name, us in totals.items()}


def prefill_matmul_choice(option: str, heads: int, kv_heads: int, head_dim: int,
                          dtype: torch.dtype) -> tuple[bool, dict[str, float]]:
    """Whether prefill groups use `prefill_attention_matmul`: "matmul" / "sdpa" as set,
    or ("auto") the faster of the two timed now in bfloat16; float32 keeps the fused
    kernel (its arithmetic is transformers' own), with no timing."""
    if option != "auto":
        return option == "matmul", {}
    if dtype == torch.float32:
        return False, {}
    timings = choose_prefill_path(heads, kv_heads, head_dim, dtype)
    return timings["matmul"] < timings["sdpa"], timings
