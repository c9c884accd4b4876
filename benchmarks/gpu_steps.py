"""Time a Llama-shaped model's steps on whatever GPU this machine has; write a step log.

The device check of issue 31: the shapes and the method of the shared H200 measurement
(../shared/measurements/h200/README.md), on any CUDA GPU, in under 5 minutes:
a model of a catalog model's shape (default Llama-3.1-8B) with random bf16 weights,
RMSNorm, RoPE, fused QKV and gate/up projections, SiLU, attention by
`scaled_dot_product_attention` (`enable_gqa=True`) over a contiguous per-sequence KV
cache, logits for the last token of each sequence only. Decode steps (`batch`
sequences at `context` tokens each) are captured and replayed as one CUDA graph (mean
of 20 replays; also the same step launched op by op, mean of 3, as `eager_ms`);
prefills (`batch` prompts of `tokens` each, empty cache) are launched op by op (mean of
2-3). A 4 GB device-to-device copy gives the memory rate.

The output is the step log that `andante calibrate --step-log` fits (one JSON object
per line, andante.perf.step_log; prefills carry `"graph": false`):

    python benchmarks/gpu_steps.py --out h100-steps.jsonl
    andante calibrate --step-log h100-steps.jsonl --model llama-3.1-8b \\
        --base-hardware h100-80g --name my-h100

A shape that does not fit the GPU's memory, or that would run past `--time-limit`, is
skipped with a `{"kind": "skipped"}` record. `--from-measurement FILE` converts a file in
the shared measurement's own format into a step log instead (no GPU needed). On a
machine without CUDA, `--device cpu --model tiny` runs the same code on a tiny model
(for tests). Prints one JSON line: device, steps written, skipped shapes, wall seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from andante.perf.catalog import get_model
from andante.perf.shape import BatchShape
from andante.perf.specs import ModelSpec
from andante.perf.step_log import step_record

ENGINE = "torch-sdpa"  # the step log's engine field: plain PyTorch, no serving engine
DECODE_SHAPES = ((1, 1024), (8, 1024), (32, 1024), (64, 1024), (128, 1024), (256, 1024),
                 (1, 8192), (32, 4096), (64, 4096))  # (batch, context)
PREFILL_SHAPES = ((1, 128), (1, 512), (1, 2048), (1, 8192), (4, 2048), (1, 32768))
#: A model small enough for a CPU test, and shapes to match.
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=256, max_model_len=512)
TINY_DECODE_SHAPES = ((1, 32), (4, 32), (2, 64))
TINY_PREFILL_SHAPES = ((1, 16), (1, 64), (2, 32))
GRAPH_REPLAYS, EAGER_DECODE_RUNS = 20, 3
COPY_BYTES = 4 << 30


class RandomLlama:
    """A Llama-family decoder of `spec`'s shape with random weights (one step at a time)."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        h, q, kv = spec.hidden_size, spec.q_size, spec.kv_size

        def weight(*size: int) -> torch.Tensor:
            return torch.empty(*size, device=device, dtype=dtype).normal_(std=0.02)

        self.embed = weight(spec.vocab_size, h)
        self.layers = [{"qkv": weight(h, q + 2 * kv), "o": weight(q, h),
                        "gate_up": weight(h, 2 * spec.intermediate_size),
                        "down": weight(spec.intermediate_size, h),
                        "norm1": torch.ones(h, device=device, dtype=dtype),
                        "norm2": torch.ones(h, device=device, dtype=dtype)}
                       for _ in range(spec.num_layers)]
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = weight(h, spec.vocab_size)
        inv = 1.0 / (500000.0 ** (torch.arange(0, spec.head_dim, 2, device=device,
                                               dtype=torch.float32) / spec.head_dim))
        self.inv_freq = inv

    def kv_cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.spec.num_kv_heads, length, self.spec.head_dim)
        return [(torch.zeros(shape, device=self.device, dtype=self.dtype),
                 torch.zeros(shape, device=self.device, dtype=self.dtype))
                for _ in range(self.spec.num_layers)]

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + 1e-5)).to(self.dtype) * weight

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float()[:, None, None] * self.inv_freq  # (s, 1, d/2)
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def forward(self, tokens: torch.Tensor, start: int,
                cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Advance `tokens` (batch, new) past `start` cached tokens; the next tokens. A
        step of several tokens is a whole prompt (start 0: the causal mask of SDPA is
        aligned to the top left) or one token per sequence past its cache."""
        spec = self.spec
        batch, new = tokens.shape
        positions = torch.arange(start, start + new, device=self.device)
        x = self.embed[tokens]
        for layer, (k_cache, v_cache) in zip(self.layers, cache, strict=True):
            qkv = self._rms(x, layer["norm1"]) @ layer["qkv"]
            q, k, v = qkv.split((spec.q_size, spec.kv_size, spec.kv_size), dim=-1)
            q = self._rope(q.view(batch, new, spec.num_heads, spec.head_dim), positions)
            k = self._rope(k.view(batch, new, spec.num_kv_heads, spec.head_dim), positions)
            k_cache[:, :, start:start + new] = k.transpose(1, 2)
            v_cache[:, :, start:start + new] = v.view(
                batch, new, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), k_cache[:, :, :start + new], v_cache[:, :, :start + new],
                is_causal=new > 1, enable_gqa=True)
            x = x + attn.transpose(1, 2).reshape(batch, new, spec.q_size) @ layer["o"]
            gate, up = (self._rms(x, layer["norm2"]) @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        logits = self._rms(x[:, -1], self.norm) @ self.lm_head
        return logits.argmax(dim=-1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mean_seconds(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    run()  # warm-up
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    _sync(device)
    return (time.perf_counter() - started) / repeats


def time_decode(model: RandomLlama, batch: int, context: int) -> dict[str, Any]:
    """One decode step of `batch` sequences at `context` tokens: graph replay (CUDA) and
    launched op by op."""
    cache = model.kv_cache(batch, context + 1)
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=model.device)

    def step() -> object:
        return model.forward(tokens, context, cache)

    eager = _mean_seconds(step, EAGER_DECODE_RUNS, model.device)
    graph_s: float | None = None
    if model.device.type == "cuda":
        stream = torch.cuda.Stream(model.device)
        stream.wait_stream(torch.cuda.current_stream(model.device))
        with torch.cuda.stream(stream):
            step()  # warm-up on a side stream, as graph capture wants
        torch.cuda.current_stream(model.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph_s = _mean_seconds(graph.replay, GRAPH_REPLAYS, model.device)
    shape = BatchShape.decode(batch, context)
    duration = graph_s if graph_s is not None else eager
    return step_record(shape, duration, batch * context, engine=ENGINE,
                       graph=graph_s is not None, batch=batch, context=context,
                       eager_ms=eager * 1e3)


def time_prefill(model: RandomLlama, batch: int, tokens: int) -> dict[str, Any]:
    """`batch` prompts of `tokens` each from an empty cache, launched op by op."""
    cache = model.kv_cache(batch, tokens)
    ids = torch.zeros(batch, tokens, dtype=torch.long, device=model.device)
    repeats = 2 if batch * tokens >= 8192 else 3
    seconds = _mean_seconds(lambda: model.forward(ids, 0, cache), repeats, model.device)
    return step_record(BatchShape.prefill(tokens, batch), seconds, 0, engine=ENGINE,
                       graph=False, batch=batch, tokens=tokens)


def copy_rate(device: torch.device, num_bytes: int) -> dict[str, Any]:
    """A device-to-device copy: bytes read plus written per second."""
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _mean_seconds(lambda: dst.copy_(src), 5, device)
    return {"kind": "hbm_copy", "read_write_gbs": 2 * num_bytes / seconds / 1e9}


def _kv_bytes(model: RandomLlama, batch: int, length: int) -> int:
    return model.spec.kv_bytes_per_token * batch * length


def fits(model: RandomLlama, batch: int, length: int) -> bool:
    """Whether a KV cache of `batch` x `length` tokens (with 20% for activations) fits
    the GPU's free memory now; always True on a CPU."""
    if model.device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(model.device)
    return _kv_bytes(model, batch, length) * 1.2 < free


def run_shapes(model: RandomLlama, decode: tuple[tuple[int, int], ...],
               prefill: tuple[tuple[int, int], ...], out: TextIO, deadline: float
               ) -> tuple[int, list[dict[str, Any]]]:
    """Time every shape that fits and that starts before `deadline`; (steps, skipped)."""
    written, skipped = 0, []
    plan = [("decode", b, n) for b, n in decode] + [("prefill", b, n) for b, n in prefill]
    for kind, batch, length in plan:
        reason = None
        if time.perf_counter() > deadline:
            reason = "time limit"
        elif not fits(model, batch, length + 1):
            reason = "memory"
        if reason is None:
            try:
                record = (time_decode if kind == "decode" else time_prefill)(
                    model, batch, length)
            except torch.OutOfMemoryError:
                reason = "memory"
        if reason is not None:
            skipped.append({"kind": "skipped", "step": kind, "batch": batch,
                            "length": length, "reason": reason})
            out.write(json.dumps(skipped[-1]) + "\n")
            continue
        out.write(json.dumps(record) + "\n")
        out.flush()
        written += 1
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    return written, skipped


def convert_measurement(lines: list[str], out: TextIO) -> int:
    """The shared measurement's format (decode: graph_ms; prefill: ms) as a step log;
    other records are copied. The number of steps written."""
    written = 0
    for text in lines:
        if not text.strip():
            continue
        row = json.loads(text)
        if row.get("kind") == "decode":
            shape = BatchShape.decode(row["batch"], row["context"])
            row = step_record(shape, row["graph_ms"] / 1e3, row["batch"] * row["context"],
                              engine=ENGINE, graph=True, batch=row["batch"],
                              context=row["context"], eager_ms=row["eager_ms"])
        elif row.get("kind") == "prefill":
            shape = BatchShape.prefill(row["tokens"], row["batch"])
            row = step_record(shape, row["ms"] / 1e3, 0, engine=ENGINE, graph=False,
                              batch=row["batch"], tokens=row["tokens"])
        written += row["kind"] == "step"
        out.write(json.dumps(row) + "\n")
    return written


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("gpu-steps.jsonl"), help="step log")
    p.add_argument("--model", default="llama-3.1-8b",
                   help="catalog model whose shape to build, or 'tiny' (CPU tests)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--time-limit", type=float, default=270.0,
                   help="seconds after which no new shape starts (default 270)")
    p.add_argument("--from-measurement", type=Path, metavar="FILE",
                   help="convert the shared measurement's format instead of timing")
    args = p.parse_args(argv)
    if args.time_limit <= 0:
        p.error(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    if args.from_measurement is not None:
        lines = args.from_measurement.read_text(encoding="utf-8").splitlines()
        with args.out.open("w", encoding="utf-8") as out:
            steps = convert_measurement(lines, out)
        print(json.dumps({"benchmark": "gpu_steps", "converted": str(args.from_measurement),
                          "steps": steps, "out": str(args.out)}))
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_steps.py: error: no CUDA device (pass --device cpu --model tiny to try "
              "it on a CPU)", file=sys.stderr)
        return 2
    tiny = args.model == "tiny"
    spec = TINY if tiny else get_model(args.model)
    torch.manual_seed(0)
    with torch.inference_mode():
        model = RandomLlama(spec, device, torch.bfloat16)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        with args.out.open("w", encoding="utf-8") as out:
            out.write(json.dumps({"kind": "setup", "device": name, "torch": torch.__version__,
                                  "model": spec.name, "weight_gb": spec.weight_bytes / 1e9,
                                  "engine": ENGINE}) + "\n")
            out.write(json.dumps(copy_rate(device, COPY_BYTES if not tiny else 1 << 20))
                      + "\n")
            steps, skipped = run_shapes(
                model, TINY_DECODE_SHAPES if tiny else DECODE_SHAPES,
                TINY_PREFILL_SHAPES if tiny else PREFILL_SHAPES, out,
                started + args.time_limit)
    print(json.dumps({"benchmark": "gpu_steps", "device": name, "model": spec.name,
                      "steps": steps, "skipped": skipped, "out": str(args.out),
                      "wall_s": round(time.perf_counter() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
