"""Does `torch.compile` pay on the real engine's step? Eager vs compiled, per layer.

Issue 15 asks to try `torch.compile` where it could pay and to report its start-up cost
either way. The GEMMs are already prepacked oneDNN calls with fused epilogues
(andante.exec.torch_layers), and inductor's lowering of those calls needs the packed
weights frozen as graph constants, i.e. one compiled graph per layer; so the trial
compiles the two regions left between them, with dynamic shapes (the token count
changes every step):

* `glue`: a layer's elementwise work: the RMS scale of the QKV GEMM, RoPE and the K/V
  concatenation, and the post-attention RMSNorm;
* `decode_attention`: a decode batch's paged attention (the block gather and the
  attention arithmetic, which inductor can fuse; eager runs `index_select` and
  `scaled_dot_product_attention`).

For each it reports the first call's seconds (compilation; dynamic shapes, so later
sizes reuse the graph) and the median CPU time per call, eager and compiled, at several
sizes, on one thread (CPU time: a busy machine moves it less than wall time). Prints ONE
JSON line. The engine itself stays eager: see the figures for why.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

# the trial compiles the eager glue: andante's TorchScript versions are opaque to dynamo
os.environ.setdefault("ANDANTE_NO_TORCHSCRIPT", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from andante.models.rope import apply_rope  # noqa: E402

HEADS, KV_HEADS, DIM, HIDDEN, BLOCK = 9, 3, 64, 576, 16  # SmolLM2-135M
EPS = torch.tensor(1e-5)


def _inv_rms(x: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    return torch.addcmul(EPS, norm, norm, value=1.0 / HIDDEN).rsqrt_().to(x.dtype)


def glue(x: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor,
         sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The elementwise work of one FusedLayer step, without its GEMMs."""
    t, split = qkv.shape[0], (HEADS + KV_HEADS) * DIM
    scale = _inv_rms(x)
    qk = apply_rope(qkv[:, :split].view(t, HEADS + KV_HEADS, DIM), cos, sin)
    kv = torch.cat((qk[:, HEADS:], qkv[:, split:].view(t, KV_HEADS, DIM)), dim=1)
    return scale, qk, kv, x * _inv_rms(x)


def decode_eager(q: torch.Tensor, pool: torch.Tensor, table: torch.Tensor,
                 lengths: torch.Tensor) -> torch.Tensor:
    batch, blocks = table.shape
    kv = pool.index_select(1, table.flatten()).view(2, KV_HEADS, batch, -1, DIM)
    visible = torch.arange(blocks * BLOCK) < lengths.unsqueeze(1)
    mask = torch.zeros(visible.shape, dtype=q.dtype).masked_fill_(~visible, float("-inf"))
    out = F.scaled_dot_product_attention(q.unsqueeze(2), kv[0].transpose(0, 1),
                                         kv[1].transpose(0, 1), attn_mask=mask[:, None, None],
                                         scale=1.0, enable_gqa=True)
    return out.view(batch, HEADS * DIM)


def decode_fusable(q: torch.Tensor, pool: torch.Tensor, table: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """The same attention written as indexing, products and reductions, which inductor
    can fuse into loops that read the blocks in place."""
    batch, blocks = table.shape
    group = HEADS // KV_HEADS
    k = pool[:KV_HEADS][:, table].reshape(KV_HEADS, batch, blocks * BLOCK, DIM)
    v = pool[KV_HEADS:][:, table].reshape(KV_HEADS, batch, blocks * BLOCK, DIM)
    qg = q.view(batch, KV_HEADS, group, 1, DIM).float()
    scores = (qg * k.permute(1, 0, 2, 3).unsqueeze(2).float()).sum(-1)
    hidden = torch.arange(blocks * BLOCK) >= lengths.view(batch, 1, 1, 1)
    probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    out = (probs.unsqueeze(-1) * v.permute(1, 0, 2, 3).unsqueeze(2).float()).sum(-2)
    return out.reshape(batch, HEADS * DIM).to(q.dtype)


def cpu_us(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        started = time.thread_time()
        fn()
        samples.append(time.thread_time() - started)
    return round(statistics.median(samples) * 1e6, 1)


def trial(eager: Callable[..., Any], compiled: Callable[..., Any],
          cases: dict[str, tuple[torch.Tensor, ...]], repeats: int) -> dict[str, Any]:
    first = next(iter(cases.values()))
    started = time.perf_counter()
    compiled(*first)
    result: dict[str, Any] = {"first_call_s": round(time.perf_counter() - started, 1)}
    for name, args in cases.items():
        eager_us = cpu_us(partial(eager, *args), repeats)
        compiled_us = cpu_us(partial(compiled, *args), repeats)
        result[name] = {"eager_us": eager_us, "compiled_us": compiled_us,
                        "ratio": round(compiled_us / eager_us, 2)}
    return result


def glue_cases(sizes: list[int]) -> dict[str, tuple[torch.Tensor, ...]]:
    cases: dict[str, tuple[torch.Tensor, ...]] = {}
    for t in sizes:
        cos, sin = torch.randn(t, 1, DIM).bfloat16(), torch.randn(t, 1, DIM).bfloat16()
        cases[f"tokens_{t}"] = (torch.randn(t, HIDDEN).bfloat16(),
                                torch.randn(t, (HEADS + 2 * KV_HEADS) * DIM).bfloat16(), cos, sin)
    return cases


def decode_cases(batches: list[int], context: int) -> dict[str, tuple[torch.Tensor, ...]]:
    pool = torch.randn(2 * KV_HEADS, 4096, BLOCK, DIM).bfloat16()
    blocks = -(-(context + 1) // BLOCK)
    cases: dict[str, tuple[torch.Tensor, ...]] = {}
    for b in batches:
        cases[f"batch_{b}"] = (torch.randn(b, HEADS, DIM).bfloat16(), pool,
                               torch.randint(0, 4096, (b, blocks)),
                               torch.full((b,), context + 1))
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 256, 2048],
                   help="step sizes of the glue trial")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16],
                   help="decode batch sizes of the attention trial")
    p.add_argument("--context", type=int, default=170, help="decode context length")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    if min(args.tokens + args.batches + [args.context, args.repeats]) < 1:
        p.error("sizes, --context and --repeats must be >= 1")
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    with torch.inference_mode():
        result = {
            "benchmark": "torch_compile_trial", "torch": torch.__version__, "threads": 1,
            "glue": trial(glue, torch.compile(glue, dynamic=True),
                          glue_cases(args.tokens), args.repeats),
            "decode_attention": trial(decode_eager, torch.compile(decode_fusable, dynamic=True),
                                      decode_cases(args.batches, args.context), args.repeats),
        }
    result["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
