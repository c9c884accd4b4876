"""RoPE frequencies and rotation agree with transformers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from andante.models.config import config_from_hf
from andante.models.rope import apply_rope, apply_rope_, inverse_frequencies, rope_table

BASE: dict[str, Any] = dict(
    model_type="llama", hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=1, intermediate_size=64, vocab_size=10, max_position_embeddings=4096,
    rope_theta=500000.0,
)
SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 1024},
]


@pytest.mark.parametrize("scaling", SCALINGS)
def test_inverse_frequencies_match_transformers(scaling: dict[str, Any] | None) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_kwargs = {k: v for k, v in BASE.items() if k != "model_type"}
    if scaling is not None:
        hf_kwargs["rope_scaling"] = scaling
    hf_config = LlamaConfig(**hf_kwargs)
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        expected = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_config)[0]
    else:
        expected = ROPE_INIT_FUNCTIONS[rope_type](hf_config, None)[0]
    ours = inverse_frequencies(config_from_hf({**BASE, "rope_scaling": scaling}, "t"))
    assert torch.equal(ours, expected.float())


def test_apply_rope_matches_rotate_half() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    config = config_from_hf(BASE, "t")
    cos, sin_signed = rope_table(inverse_frequencies(config), 64, torch.float32)
    positions = torch.tensor([0, 3, 17, 63])
    x = torch.randn(4, 6, config.head_dim)
    ours = apply_rope(x, cos[positions].unsqueeze(1), sin_signed[positions].unsqueeze(1))
    freqs = torch.outer(positions.float(), inverse_frequencies(config))
    emb = torch.cat((freqs, freqs), dim=-1)
    q = x.transpose(0, 1).unsqueeze(0)  # [1, heads, T, D]
    expected, _ = apply_rotary_pos_emb(q, q, emb.cos()[None], emb.sin()[None])
    torch.testing.assert_close(ours, expected[0].transpose(0, 1), rtol=1e-6, atol=1e-6)


def test_unknown_rope_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="yarn"):
        config_from_hf({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "t")


def test_dynamic_scaling_caps_the_context() -> None:
    config = config_from_hf({**BASE, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
                            "t")
    assert config.rope_scaling.rope_type == "default"
    assert config.max_model_len == 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope_in_place_rotates_a_view_like_apply_rope(dtype: torch.dtype) -> None:
    """`apply_rope_` on the Q/K columns of QKV rows: the same values as `apply_rope`
    (bit for bit), written into the view, the V columns untouched."""
    config = config_from_hf(BASE, "t")
    cos, sin_signed = rope_table(inverse_frequencies(config), 64, dtype)
    positions = torch.tensor([0, 3, 17, 63])
    cos, sin_signed = cos[positions].unsqueeze(1), sin_signed[positions].unsqueeze(1)
    qkv = torch.randn(4, 8 * config.head_dim).to(dtype)
    before = qkv.clone()
    qk = qkv[:, :6 * config.head_dim].view(4, 6, config.head_dim)
    expected = apply_rope(qk.clone(), cos, sin_signed)
    out = apply_rope_(qk, cos, sin_signed)
    assert out.data_ptr() == qkv.data_ptr() and torch.equal(out, expected)
    assert torch.equal(qkv[:, 6 * config.head_dim:], before[:, 6 * config.head_dim:])
