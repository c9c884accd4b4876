"""The architecture of a Llama-family checkpoint, read from `config.json` or GGUF metadata.

One frozen `ModelConfig` covers Llama 1-3, Mistral, Qwen2 and SmolLM: RMSNorm, RoPE
(optionally scaled: linear or llama3; dynamic NTK is exact only up to the original
context, so the context is capped there), grouped-query attention,
SwiGLU MLP, optional q/k/v biases (Qwen2), optionally tied embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from andante.perf.specs import ModelSpec

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "smollm", "smollm2")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE scaling as Hugging Face describes it (`rope_scaling` / `rope_parameters`)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope scaling type {self.rope_type!r}; "
                             f"supported: {', '.join(ROPE_TYPES)}")
        if not self.factor > 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor!r}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    attention_bias: bool = False

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                           "head_dim", "intermediate_size", "vocab_size", "max_model_len"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model config {field_name} must be a positive integer, "
                                 f"got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads={self.num_kv_heads} must divide "
                             f"num_attention_heads={self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def to_model_spec(self, dtype_bytes: int = 2, name: str | None = None) -> ModelSpec:
        """The cost model's view of this architecture."""
        return ModelSpec(
            name=name or self.name, num_layers=self.num_layers, hidden_size=self.hidden_size,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
            mlp_kind="gated", tie_word_embeddings=self.tie_word_embeddings,
            dtype_bytes=dtype_bytes, max_model_len=self.max_model_len,
        )


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


def config_from_hf(data: Mapping[str, Any], name: str) -> ModelConfig:
    """A `ModelConfig` from the contents of a Hugging Face `config.json`."""
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
    return ModelConfig(
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
