"""Prefill attention by the fused kernel or by matmuls in the model dtype
(andante.exec.torch_attention): the same results within one rounding of the model dtype,
over whole and partial query blocks, groups of fresh prompts and chunks after a cached
prefix, and a start-up choice."""

from __future__ import annotations

import pytest
import torch

from andante.exec.torch_attention import (
    PREFILL_BLOCK,
    causal_block,
    choose_prefill_path,
    flat_rows,
    prefill_attention,
    prefill_attention_matmul,
    prefill_matmul_choice,
)

_EMPTY = torch.empty(0)


def _both(n: int, c: int, dtype: torch.dtype, scale: float | None,
          heads: int = 9, kv_heads: int = 3, dim: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(n * 1000 + c)
    q = (torch.randn(n * c, heads, dim) * 0.4).to(dtype)
    k = (torch.randn(n * c, kv_heads, dim) * 0.4).to(dtype)
    v = torch.randn(n * c, kv_heads, dim).to(dtype)
    fused = prefill_attention(q, k, v, _EMPTY, n, c, 0, None, None, kv_heads, scale, _EMPTY)
    matmul = prefill_attention(q, k, v, _EMPTY, n, c, 0, None, None, kv_heads, scale,
                               causal_block(PREFILL_BLOCK, dtype))
    return fused, matmul


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("scale", [None, 0.125])
@pytest.mark.parametrize("n,c", [(1, 2), (1, PREFILL_BLOCK), (1, 2 * PREFILL_BLOCK + 44),
                                 (3, 50), (2, PREFILL_BLOCK + 1)])
def test_both_paths_agree(n: int, c: int, dtype: torch.dtype, tolerance: float,
                          scale: float | None) -> None:
    fused, matmul = _both(n, c, dtype, scale)
    assert matmul.dtype == dtype and matmul.shape == fused.shape == (n * c, 9 * 64)
    assert torch.allclose(fused.float(), matmul.float(), atol=tolerance, rtol=0)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("cached,c", [(16, 40), (45, 2 * PREFILL_BLOCK + 3), (200, 1 + 1)])
def test_a_chunk_after_a_cached_prefix(cached: int, c: int, dtype: torch.dtype,
                                       tolerance: float) -> None:
    """Its blocks gathered from the pool (as the step's plan addresses them), under the
    group's bottom-right causal mask (andante.exec.torch_inputs) by the kernel."""
    torch.manual_seed(cached + c)
    kv_heads, heads, dim, block_size, pool_blocks = 3, 9, 64, 16, 40
    used = -(-(cached + c) // block_size)
    pool = (torch.randn(2 * kv_heads, pool_blocks, block_size, dim) * 0.4).to(dtype)
    table = torch.randperm(pool_blocks)[:used]
    rows = flat_rows(table, 2 * kv_heads, pool_blocks)
    hidden = torch.ones(c, cached + c, dtype=torch.bool).triu_(cached + 1)
    mask = torch.zeros(c, cached + c, dtype=dtype).masked_fill_(hidden, float("-inf"))
    q = (torch.randn(c, heads, dim) * 0.4).to(dtype)
    unused = torch.empty(c, kv_heads, dim, dtype=dtype)  # the chunk's K/V are in the pool
    args = (q, unused, unused, pool, 1, c, cached, rows, mask, kv_heads, None)
    fused = prefill_attention(*args, _EMPTY)
    matmul = prefill_attention(*args, causal_block(PREFILL_BLOCK, dtype))
    assert matmul.shape == fused.shape == (c, heads * dim)
    assert torch.allclose(fused.float(), matmul.float(), atol=tolerance, rtol=0)


def test_the_matmul_path_is_causal() -> None:
    """A later token's K/V changes no earlier query's output."""
    n, c, kv_heads = 1, PREFILL_BLOCK + 20, 2
    q, k, v = (torch.randn(c, h, 16) for h in (4, kv_heads, kv_heads))
    causal = causal_block(PREFILL_BLOCK, torch.float32)

    def run() -> torch.Tensor:
        keys, values = (t.view(1, c, kv_heads, 16).transpose(1, 2) for t in (k, v))
        return prefill_attention_matmul(q, keys, values, n, c, 0, kv_heads, causal, None)

    before = run()
    k[-1], v[-1] = k[-1] + 5, v[-1] - 5
    after = run()
    assert torch.equal(before[:-1], after[:-1]) and not torch.equal(before[-1], after[-1])


def test_the_causal_block_mask() -> None:
    mask = causal_block(3, torch.bfloat16)
    assert mask.dtype == torch.bfloat16
    assert mask.isinf().tolist() == [[False, True, True], [False, False, True],
                                     [False, False, False]]


def test_the_choice_times_both_paths() -> None:
    timings = choose_prefill_path(4, 2, 16, torch.bfloat16, rounds=1, reps=1)
    assert set(timings) == {"sdpa", "matmul"} and all(t > 0 for t in timings.values())
    assert prefill_matmul_choice("matmul", 4, 2, 16, torch.float32) == (True, {})
    assert prefill_matmul_choice("sdpa", 4, 2, 16, torch.bfloat16) == (False, {})
    # float32 keeps the fused kernel (transformers' arithmetic) without timing
    assert prefill_matmul_choice("auto", 4, 2, 16, torch.float32) == (False, {})
    matmul, measured = prefill_matmul_choice("auto", 4, 2, 16, torch.bfloat16)
    assert set(measured) == {"sdpa", "matmul"}
    assert matmul == (measured["matmul"] < measured["sdpa"])


def test_a_bad_option_is_refused() -> None:
    from andante.exec.torch_executor import TorchExecutorOptions

    with pytest.raises(ValueError, match="prefill_attention"):
        TorchExecutorOptions(prefill_attention="fast")  # type: ignore[arg-type]
