"""Load a llama-family GGUF file: architecture, dequantized weights, tokenizer.

Design note. llama.cpp's converter (convert_hf_to_gguf.py, `LlamaModel.permute`)
reorders the rows of Q and K of the `llama` architecture so that its RoPE can rotate
interleaved pairs; `_unpermute` restores Hugging Face's half-split order (the inverse
that transformers' GGUF loader applies too). `qwen2` files keep Hugging Face order.
Weights are dequantized with the `gguf` package one tensor at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from andante.models.gguf_reader import GGUFFile
from andante.models.gguf_tokenizer import tokenizer_from_gguf
from andante.models.tokenizer import TextTokenizer
from andante.models.weights import ModelWeights, build_weights
from andante.perf.specs import ModelSpec, RopeScaling

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")
_PERMUTED_ARCHITECTURES = ("llama", "mistral")
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of a Hugging Face tensor name."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    _, _, index, rest = hf_name.split(".", 3)
    return f"blk.{index}.{_LAYER_NAMES.get(rest, rest)}"


def _unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(fields: dict[str, Any], key: str, path: Path) -> Any:
    if key not in fields:
        raise ValueError(f"{path}: GGUF metadata lacks {key!r}")
    return fields[key]


def _rope_scaling(fields: dict[str, Any], arch: str) -> RopeScaling:
    kind = str(fields.get(f"{arch}.rope.scaling.type", "none"))
    if kind in ("none", ""):
        return RopeScaling()
    if kind != "linear":
        raise ValueError(f"unsupported GGUF rope scaling type {kind!r}")
    return RopeScaling("linear", float(fields.get(f"{arch}.rope.scaling.factor", 1.0)))


def config_from_gguf(gguf: GGUFFile) -> ModelSpec:
    f, path = gguf.fields, gguf.path
    arch = str(_field(f, "general.architecture", path))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: unsupported architecture {arch!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    hidden = int(_field(f, f"{arch}.embedding_length", path))
    heads = int(_field(f, f"{arch}.attention.head_count", path))
    vocab = f.get(f"{arch}.vocab_size") or len(f.get("tokenizer.ggml.tokens", ()))
    return ModelSpec(
        name=str(f.get("general.name") or path.stem), model_type=arch,
        num_layers=int(_field(f, f"{arch}.block_count", path)), hidden_size=hidden,
        num_heads=heads, num_kv_heads=int(f.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(f.get(f"{arch}.attention.key_length", hidden // heads)),
        intermediate_size=int(_field(f, f"{arch}.feed_forward_length", path)),
        vocab_size=int(vocab), max_model_len=int(f.get(f"{arch}.context_length", 4096)),
        rms_norm_eps=float(f.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(f, arch),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
    )


def _fetcher(gguf: GGUFFile, config: ModelSpec):  # type: ignore[no-untyped-def]
    permuted = config.model_type in _PERMUTED_ARCHITECTURES

    def fetch(hf_name: str) -> torch.Tensor | None:
        name = gguf_name(hf_name)
        if name not in gguf.tensors:
            return None
        array = gguf.dequantize(name)
        if permuted and ".attn_q." in name:
            array = _unpermute(array, config.num_heads)
        elif permuted and ".attn_k." in name:
            array = _unpermute(array, config.num_kv_heads)
        if not array.flags.writeable:
            array = array.copy()
        return torch.from_numpy(np.ascontiguousarray(array))

    return fetch


def load_gguf(path: Path, dtype: torch.dtype
              ) -> tuple[ModelSpec, ModelWeights, TextTokenizer]:
    gguf = GGUFFile(path).read()
    try:
        config = config_from_gguf(gguf)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    factors = None
    if "rope_freqs.weight" in gguf.tensors:
        factors = torch.from_numpy(gguf.dequantize("rope_freqs.weight").copy())
    weights = build_weights(config, _fetcher(gguf, config), str(path), dtype, factors)
    return config, weights, tokenizer_from_gguf(gguf)
