"""The architecture of a Llama-family checkpoint, read from a Hugging Face `config.json`.

The result is the one `ModelSpec` (andante.perf.specs) the cost model also reads; it
covers Llama 1-3, Mistral, Qwen2 and SmolLM: RMSNorm, RoPE (optionally scaled: linear or
llama3; dynamic NTK is exact only up to the original context, so the context is capped
there), grouped-query attention, SwiGLU MLP, optional q/k/v biases (Qwen2), optionally
tied embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from andante.perf.specs import ModelSpec, RopeScaling

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "smollm", "smollm2")


def _rope_from_hf(data: Mapping[str, Any]) -> tuple[float, RopeScaling, int | None]:
    """(theta, scaling, context cap) from transformers 4.x (`rope_theta` + `rope_scaling`)
    or 5.x (`rope_parameters`) config keys. Dynamic NTK scaling leaves RoPE unscaled up to
    the original context, so it becomes plain RoPE capped there."""
    params = data.get("rope_parameters")
    scaling = dict(params) if isinstance(params, Mapping) else {}
    legacy = data.get("rope_scaling")
    if isinstance(legacy, Mapping):
        scaling.update(legacy)
    theta = float(scaling.get("rope_theta", data.get("rope_theta", 10000.0)))
    rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
    original = scaling.get("original_max_position_embeddings")
    original = int(original) if original is not None else None
    if rope_type == "dynamic":
        return theta, RopeScaling(), original or data.get("max_position_embeddings")
    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(scaling.get("factor", 1.0)),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
    ), None


def _require(data: Mapping[str, Any], key: str) -> Any:
    if key not in data:
        raise ValueError(f"config.json lacks {key!r}")
    return data[key]


def config_from_hf(data: Mapping[str, Any], name: str) -> ModelSpec:
    """The `ModelSpec` of the contents of a Hugging Face `config.json`."""
    model_type = str(data.get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is supported")
    hidden = int(_require(data, "hidden_size"))
    heads = int(_require(data, "num_attention_heads"))
    head_dim = data.get("head_dim") or hidden // heads
    max_len = int(data.get("max_position_embeddings", 4096))
    window = data.get("sliding_window")
    if window and data.get("use_sliding_window", True) and int(window) < max_len:
        max_len = int(window)  # full attention is exact up to the window
    theta, scaling, cap = _rope_from_hf(data)
    if cap:
        max_len = min(max_len, int(cap))
    return ModelSpec(
        name=name, model_type=model_type,
        num_layers=int(_require(data, "num_hidden_layers")), hidden_size=hidden,
        num_heads=heads, num_kv_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(head_dim), intermediate_size=int(_require(data, "intermediate_size")),
        vocab_size=int(_require(data, "vocab_size")), max_model_len=max_len,
        rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        attention_bias=bool(data.get("attention_bias", model_type == "qwen2")),
    )
