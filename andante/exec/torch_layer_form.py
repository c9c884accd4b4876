"""Which form the fused bf16 layers take on this CPU, timed at start-up.

Design note. The fused layer (andante.exec.torch_layers) can run its projections with
oneDNN epilogues (the 1/rms scale as a "mul" post-op of the QKV GEMM, the residuals as
"add" post-ops, SwiGLU as a "swish" gate GEMM and a "mul" up GEMM) or plain (an RMSNorm
kernel, post-op-free GEMMs, one gate/up GEMM, SiLU and its product in float32 as the
epilogues compute them, the residual adds as separate in-place kernels; SmolLM2's logits
3.0% from float32's, relative L2, against 4.8% with SiLU in bf16 and 6.9% for
transformers' own bf16 run). Which is faster depends on the CPU: on the AMX machine the engine was
first tuned on, the epilogues won (7-15% less MLP time); on an AVX-512 BF16 CPU without
AMX (issue 32; one thread, thread CPU time, SmolLM2's shapes) a binary post-op cost
~15 us per GEMM at 1-16 rows: at 8 rows the output projection took 47.9 -> 32.6 us
plain, the down projection 75.1 -> 59.5 us, the QKV projection 72 -> 56 us, the MLP's
gate/up 131 -> 110 us, about 2 ms per 30-layer decode step, and within +-5% either way
at 256 rows (MLP 1.96 vs 2.09 ms). So the
executor times both forms' non-attention work (`project_qkv`, `output_and_mlp`) on
random weights of the model's shapes at CHOICE_ROWS rows, interleaved, and packs the
weights once for the faster form (`choose_layer_form`); the sum over the row counts
weighs decode sizes (most of a server's steps) and one prefill size.
"""

from __future__ import annotations

import statistics
import time

import torch

from andante.exec.torch_layers import (
    fused_weights,
    layer_shape,
    output_and_mlp,
    project_qkv,
)
from andante.models.weights import LayerWeights
from andante.perf.specs import ModelSpec

#: Row counts the start-up choice times both forms at.
CHOICE_ROWS = (1, 8, 16, 256)
LAYER_FORMS = ("auto", "epilogue", "plain")


def random_layer_weights(config: ModelSpec, dtype: torch.dtype) -> LayerWeights:
    hidden, inter = config.hidden_size, config.intermediate_size
    qkv_rows = config.q_size + 2 * config.kv_size

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape) * 0.02).to(dtype)

    return LayerWeights(torch.ones(hidden, dtype=dtype), rand(qkv_rows, hidden), None,
                        rand(hidden, config.q_size), torch.ones(hidden, dtype=dtype),
                        rand(2 * inter, hidden), rand(hidden, inter))


def time_layer_forms(config: ModelSpec, dtype: torch.dtype, rounds: int = 4,
                     reps: int = 5) -> dict[str, float]:
    """Median microseconds of both forms' non-attention work per layer, summed over
    CHOICE_ROWS: {"epilogue": us, "plain": us}, interleaved rounds at the current
    thread count (the first round warms up: oneDNN builds its primitives)."""
    layer, empty = random_layer_weights(config, dtype), torch.empty(0, dtype=dtype)
    forms = {name: (fused_weights(config, layer, empty, empty, name == "epilogue"),
                    layer_shape(config, name == "epilogue"))
             for name in ("epilogue", "plain")}
    totals = dict.fromkeys(forms, 0.0)
    with torch.inference_mode():
        for rows in CHOICE_ROWS:
            x = torch.randn(rows, config.hidden_size).to(dtype)
            attn = torch.randn(rows, config.q_size).to(dtype)
            samples: dict[str, list[float]] = {name: [] for name in forms}
            for _ in range(rounds + 1):
                for name, (w, shape) in forms.items():
                    started = time.perf_counter()
                    for _ in range(reps):
                        project_qkv(x, w, shape)
                        output_and_mlp(attn, x, w, shape)
                    samples[name].append((time.perf_counter() - started) / reps * 1e6)
            for name, times in samples.items():
                totals[name] += statistics.median(times[1:])
    return {name: round(us, 1) for name, us in totals.items()}


def choose_layer_form(option: str, config: ModelSpec,
                      dtype: torch.dtype) -> tuple[bool, dict[str, float]]:
    """Whether the fused layers use epilogues: "epilogue" / "plain" as set, or ("auto")
    the faster form timed now; with the timings (empty when set)."""
    if option not in LAYER_FORMS:
        raise ValueError(f"layer_form must be one of {LAYER_FORMS}, got {option!r}")
    if option != "auto":
        return option == "epilogue", {}
    timings = time_layer_forms(config, dtype)
    return timings["epilogue"] < timings["plain"], timings
