"""The Llama-family forward pass of one fused step over the paged KV cache.

Design note. All rows of the step (andante.exec.torch_inputs) go through each layer
together, with no per-request loop; the layers are `ExactLayer` (float32, Hugging Face
arithmetic) or `FusedLayer` (bfloat16, prepacked oneDNN GEMMs with fused epilogues), see
andante.exec.torch_layers. Only the rows that sample a token reach the final norm and
the LM head.

With `buckets` (the fused path only: its oneDNN GEMMs build primitives per row count,
andante.perf.step_sizes), the step's rows are padded with zero rows up to their bucket
before the first layer and the sampled rows up to theirs before the LM head; attention,
the K/V writes and sampling see only the real rows (andante.exec.torch_layers.attend),
and a GEMM computes each output row from its own input row, so the pad rows change no
real row's result. The float32 `ExactLayer` path runs MKL GEMMs, which have no per-size
setup, and is never padded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from andante.exec.torch_inputs import StepInputs
from andante.exec.torch_kv import KVPools
from andante.exec.torch_layers import (
    ExactLayer,
    FusedLayer,
    LMHead,
    packed_gemm_supported,
    run_layers,
)
from andante.models.rope import inverse_frequencies, rope_table
from andante.models.weights import ModelWeights
from andante.perf.specs import ModelSpec
from andante.perf.step_sizes import StepBuckets


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` [n, d] with zero rows appended up to `rows` (itself when n >= rows)."""
    missing = rows - x.shape[0]
    return F.pad(x, (0, 0, 0, missing)) if missing > 0 else x


class TransformerRunner:
    def __init__(self, config: ModelSpec, weights: ModelWeights, kv: KVPools,
                 max_len: int, fused: bool | None = None,
                 buckets: StepBuckets | None = None, epilogues: bool = True) -> None:
        self.config = config
        self.embed = weights.embed
        self.fused = packed_gemm_supported(weights.dtype) if fused is None else fused
        # row buckets of the dense GEMMs: the fused path only (see the module note)
        self.buckets = buckets if self.fused else None
        self.layers: list[ExactLayer | FusedLayer] = [
            FusedLayer(config, w, kv.layer(i), kv.layer_slots(i), epilogues) if self.fused
            else ExactLayer(config, w, kv.layer(i), kv.layer_slots(i))
            for i, w in enumerate(weights.layers)]
        self.lm_head = LMHead(weights.final_norm, weights.lm_head, config.rms_norm_eps,
                              self.fused)
        inv_freq = inverse_frequencies(config, weights.rope_freq_factors)
        self.cos, self.sin = rope_table(inv_freq, max_len, weights.dtype)

    def bind_kv(self, kv: KVPools) -> None:
        """Point every layer at `kv`'s current tensors (after KVPools.release / restore:
        no layer keeps a view of a released pool)."""
        for i, layer in enumerate(self.layers):
            layer.bind_kv(kv.layer(i), kv.layer_slots(i))

    def forward(self, inputs: StepInputs, num_layers: int | None = None) -> torch.Tensor:
        """Run every row of the step; logits of the sampled rows, [S, vocab], in the model
        dtype (the sampler upcasts only the rows it samples at random). `num_layers`:
        run only the first ones (the executor's warm-up: every layer has the same GEMM
        shapes, so one layer builds the primitives of all)."""
        x = F.embedding(inputs.input_ids, self.embed)
        buckets = self.buckets
        if buckets is not None:
            x = pad_rows(x, buckets.pad(x.shape[0]))
        cos = self.cos.index_select(0, inputs.positions).unsqueeze(1)
        sin = self.sin.index_select(0, inputs.positions).unsqueeze(1)
        x = run_layers(self.layers[:num_layers], x, inputs, cos, sin)
        rows = x.index_select(0, inputs.sample_rows)
        if buckets is None:
            return self.lm_head(rows)
        num_sampled = rows.shape[0]
        return self.lm_head(pad_rows(rows, buckets.pad(num_sampled)))[:num_sampled]
