"""The Llama-family forward pass of one fused step over the paged KV cache.

Design note. All rows of the step (andante.exec.torch_inputs) go through each layer
together, with no per-request loop; the layers are `ExactLayer` (float32, Hugging Face
arithmetic) or `FusedLayer` (bfloat16, prepacked oneDNN GEMMs with fused epilogues), see
andante.exec.torch_layers. Only the rows that sample a token reach the final norm and
the LM head.
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
from andante.models.config import ModelConfig
from andante.models.rope import inverse_frequencies, rope_table
from andante.models.weights import ModelWeights


class TransformerRunner:
    def __init__(self, config: ModelConfig, weights: ModelWeights, kv: KVPools,
                 max_len: int, fused: bool | None = None) -> None:
        self.config = config
        self.embed = weights.embed
        self.fused = packed_gemm_supported(weights.dtype) if fused is None else fused
        layer_cls = FusedLayer if self.fused else ExactLayer
        self.layers = [layer_cls(config, w, kv.layer(i), kv.layer_slots(i))
                       for i, w in enumerate(weights.layers)]
        self.lm_head = LMHead(weights.final_norm, weights.lm_head, config.rms_norm_eps,
                              self.fused)
        inv_freq = inverse_frequencies(config, weights.rope_freq_factors)
        self.cos, self.sin = rope_table(inv_freq, max_len, weights.dtype)

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Run every row of the step; logits of the sampled rows, [S, vocab], in the model
        dtype (the sampler upcasts only the rows it samples at random)."""
        x = F.embedding(inputs.input_ids, self.embed)
        cos = self.cos.index_select(0, inputs.positions).unsqueeze(1)
        sin = self.sin.index_select(0, inputs.positions).unsqueeze(1)
        x = run_layers(self.layers, x, inputs, cos, sin)
        return self.lm_head(x.index_select(0, inputs.sample_rows))
