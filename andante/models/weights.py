"""A checkpoint's tensors, arranged for the executor's forward pass.

Q, K and V projections are fused into one matrix (and one bias, for Qwen2), gate and up
into another, so a layer runs four GEMMs. Tensors arrive under Hugging Face names
(`model.layers.0.self_attn.q_proj.weight`, ...); the GGUF loader renames its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from andante.perf.specs import ModelSpec

Fetch = Callable[[str], torch.Tensor | None]


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [q_size + 2 kv_size, hidden]
    qkv_bias: torch.Tensor | None  # [q_size + 2 kv_size] (Qwen2)
    o_proj: torch.Tensor  # [hidden, q_size]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]


@dataclass(slots=True)
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied
    rope_freq_factors: torch.Tensor | None = None  # GGUF llama3 scaling

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def to(self, dtype: torch.dtype) -> ModelWeights:
        """A copy in `dtype` (self if already there); ties stay tied."""
        if dtype == self.dtype:
            return self
        tied = self.lm_head is self.embed
        embed = self.embed.to(dtype)
        layers = [LayerWeights(
            input_norm=w.input_norm.to(dtype), qkv=w.qkv.to(dtype),
            qkv_bias=None if w.qkv_bias is None else w.qkv_bias.to(dtype),
            o_proj=w.o_proj.to(dtype), post_norm=w.post_norm.to(dtype),
            gate_up=w.gate_up.to(dtype), down=w.down.to(dtype)) for w in self.layers]
        return ModelWeights(embed, layers, self.final_norm.to(dtype),
                            embed if tied else self.lm_head.to(dtype), self.rope_freq_factors)


def _need(fetch: Fetch, name: str, shape: tuple[int, ...], source: str) -> torch.Tensor:
    tensor = fetch(name)
    if tensor is None:
        raise ValueError(f"{source}: missing tensor {name!r}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                         f"expected {shape}")
    return tensor


def _layer(config: ModelSpec, fetch: Fetch, i: int, source: str,
           dtype: torch.dtype) -> LayerWeights:
    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    p = f"model.layers.{i}."

    def need(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return _need(fetch, p + name, shape, source).to(dtype)

    qkv = torch.cat([need("self_attn.q_proj.weight", (q, h)),
                     need("self_attn.k_proj.weight", (kv, h)),
                     need("self_attn.v_proj.weight", (kv, h))])
    bias = None
    if config.attention_bias:
        bias = torch.cat([need("self_attn.q_proj.bias", (q,)),
                          need("self_attn.k_proj.bias", (kv,)),
                          need("self_attn.v_proj.bias", (kv,))])
    gate_up = torch.cat([need("mlp.gate_proj.weight", (inter, h)),
                         need("mlp.up_proj.weight", (inter, h))])
    return LayerWeights(
        input_norm=need("input_layernorm.weight", (h,)), qkv=qkv, qkv_bias=bias,
        o_proj=need("self_attn.o_proj.weight", (h, q)),
        post_norm=need("post_attention_layernorm.weight", (h,)), gate_up=gate_up,
        down=need("mlp.down_proj.weight", (h, inter)),
    )


def build_weights(config: ModelSpec, fetch: Fetch, source: str,
                  dtype: torch.dtype = torch.bfloat16,
                  rope_freq_factors: torch.Tensor | None = None) -> ModelWeights:
    """Assemble the executor's weights from tensors under Hugging Face names.

    `fetch(name)` returns a tensor or None; `source` names the checkpoint in errors.
    """
    h, vocab = config.hidden_size, config.vocab_size
    embed = _need(fetch, "model.embed_tokens.weight", (vocab, h), source).to(dtype)
    layers = [_layer(config, fetch, i, source, dtype) for i in range(config.num_layers)]
    norm = _need(fetch, "model.norm.weight", (h,), source).to(dtype)
    head = None if config.tie_word_embeddings else fetch("lm_head.weight")
    if head is None and not config.tie_word_embeddings:
        raise ValueError(f"{source}: missing tensor 'lm_head.weight' (embeddings not tied)")
    if head is not None and tuple(head.shape) != (vocab, h):
        raise ValueError(f"{source}: lm_head.weight has shape {tuple(head.shape)}, "
                         f"expected {(vocab, h)}")
    lm_head = embed if head is None else head.to(dtype)
    return ModelWeights(embed, layers, norm, lm_head, rope_freq_factors)

