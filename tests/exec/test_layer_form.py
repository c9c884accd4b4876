"""The fused layer's two forms (oneDNN epilogues or plain GEMMs, andante.exec.torch_layers)
compute the same rows within bf16 rounding, and the start-up choice times both."""

from __future__ import annotations

import pytest
import torch

from andante.exec.torch_layer_form import choose_layer_form, random_layer_weights, time_layer_forms
from andante.exec.torch_layers import (
    fused_weights,
    layer_shape,
    output_and_mlp,
    packed_gemm_supported,
    project_qkv,
)
from andante.perf.specs import ModelSpec

SPEC = ModelSpec("tiny", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=2,
                 head_dim=16, intermediate_size=96, vocab_size=100)

needs_bf16 = pytest.mark.skipif(not packed_gemm_supported(torch.bfloat16),
                                reason="no oneDNN bf16 GEMMs on this CPU")


@needs_bf16
@pytest.mark.parametrize("rows", [1, 8, 33])
def test_both_forms_agree(rows: int) -> None:
    torch.manual_seed(0)
    layer = random_layer_weights(SPEC, torch.bfloat16)
    empty = torch.empty(0, dtype=torch.bfloat16)
    x = torch.randn(rows, SPEC.hidden_size).to(torch.bfloat16)
    attn = torch.randn(rows, SPEC.q_size).to(torch.bfloat16)
    out = {}
    with torch.inference_mode():
        for epilogues in (True, False):
            w = fused_weights(SPEC, layer, empty, empty, epilogues)
            shape = layer_shape(SPEC, epilogues)
            out[epilogues] = (project_qkv(x, w, shape).float(),
                              output_and_mlp(attn, x, w, shape).float())
    for with_epilogues, plain in zip(out[True], out[False], strict=True):
        scale = with_epilogues.abs().max().item()
        assert torch.allclose(with_epilogues, plain, atol=0.02 * scale, rtol=0.02)


@needs_bf16
def test_the_choice_times_both_forms() -> None:
    timings = time_layer_forms(SPEC, torch.bfloat16, rounds=1, reps=1)
    assert set(timings) == {"epilogue", "plain"} and all(t > 0 for t in timings.values())
    epilogues, measured = choose_layer_form("auto", SPEC, torch.bfloat16)
    assert epilogues == (measured["epilogue"] < measured["plain"])
    assert choose_layer_form("plain", SPEC, torch.bfloat16) == (False, {})
    assert choose_layer_form("epilogue", SPEC, torch.bfloat16) == (True, {})


def test_a_bad_form_is_refused() -> None:
    from andante.exec.torch_executor import TorchExecutorOptions

    with pytest.raises(ValueError, match="layer_form"):
        TorchExecutorOptions(layer_form="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layer_form"):
        choose_layer_form("fast", SPEC, torch.bfloat16)
