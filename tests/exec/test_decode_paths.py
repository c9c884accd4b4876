"""Decode attention by the fused kernel or by matmuls (andante.exec.torch_attention):
the same results within one rounding of the model dtype, and a start-up choice."""

from __future__ import annotations

import pytest
import torch

from andante.exec.torch_attention import (
    DECODE_PATHS,
    choose_decode_path,
    decode_attention,
    decode_attention_matmul,
    decode_path_choice,
    flat_rows,
)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("scale", [None, 0.125])
def test_both_paths_agree(dtype: torch.dtype, tolerance: float, scale: float | None) -> None:
    torch.manual_seed(0)
    kv_heads, heads, dim, block_size, blocks = 3, 9, 64, 16, 40
    pool = torch.randn(2 * kv_heads, blocks, block_size, dim).to(dtype)
    table = torch.tensor([[5, 7, 9], [1, 2, 0], [11, 12, 13]])
    rows = flat_rows(table.flatten(), 2 * kv_heads, blocks)
    mask = torch.zeros(3, 1, 1, 3 * block_size, dtype=dtype)
    mask[0, ..., 40:] = float("-inf")  # padding of the shorter sequences
    mask[1, ..., 20:] = float("-inf")
    q = torch.randn(3, heads, dim).to(dtype)
    fused = decode_attention(q, pool, rows, mask, kv_heads, scale)
    matmul = decode_attention_matmul(q, pool, rows, mask, kv_heads, scale)
    assert matmul.dtype == dtype and matmul.shape == (3, heads * dim)
    assert torch.allclose(fused.float(), matmul.float(), atol=tolerance, rtol=0)


def test_the_choice_times_both_paths() -> None:
    timings = choose_decode_path(4, 2, 16, torch.float32, 16, rounds=1, reps=1)
    assert set(timings) == {"sdpa", "matmul"} and all(t > 0 for t in timings.values())
    path, measured = decode_path_choice("auto", 4, 2, 16, torch.float32, 16)
    matmul = path != "sdpa"
    assert matmul == (measured["matmul"] < measured["sdpa"])
    assert decode_path_choice("matmul", 4, 2, 16, torch.float32, 16) == ("matmul", {})
    assert decode_path_choice("sdpa", 4, 2, 16, torch.float32, 16) == ("sdpa", {})


def test_a_bad_option_is_refused() -> None:
    from andante.exec.torch_executor import TorchExecutorOptions

    with pytest.raises(ValueError, match="decode_attention"):
        TorchExecutorOptions(decode_attention="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_the_native_matmuls_agree(dtype: torch.dtype, tolerance: float) -> None:
    """Matmuls in the model dtype (scores and probabilities rounded to it): within a few
    bf16 roundings of the float32 matmuls; identical arithmetic in float32."""
    torch.manual_seed(1)
    kv_heads, heads, dim, block_size, blocks = 3, 9, 64, 16, 40
    pool = (torch.randn(2 * kv_heads, blocks, block_size, dim) * 0.5).to(dtype)
    table = torch.tensor([[5, 7, 9], [1, 2, 0]])
    rows = flat_rows(table.flatten(), 2 * kv_heads, blocks)
    mask = torch.zeros(2, 1, 1, 3 * block_size, dtype=dtype)
    mask[1, ..., 20:] = float("-inf")
    q = (torch.randn(2, heads, dim) * 0.5).to(dtype)
    exact = decode_attention_matmul(q, pool, rows, mask, kv_heads, None)
    native = decode_attention_matmul(q, pool, rows, mask, kv_heads, None, True)
    assert native.dtype == dtype and native.shape == exact.shape
    assert torch.allclose(exact.float(), native.float(), atol=tolerance, rtol=0)


def test_the_path_choice_names_the_fastest() -> None:
    path, timings = decode_path_choice("auto", 4, 2, 16, torch.bfloat16, 16)
    assert set(timings) == {"sdpa", "matmul"} and path == min(timings, key=timings.get)
    both = choose_decode_path(4, 2, 16, torch.bfloat16, 16, rounds=1, reps=1,
                              paths=DECODE_PATHS)
    assert set(both) == set(DECODE_PATHS) and all(t > 0 for t in both.values())
    assert decode_path_choice("matmul_native", 4, 2, 16, torch.float32, 16) == (
        "matmul_native", {})
