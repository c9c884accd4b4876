"""Step-size buckets on the real engine: pad rows change no output, the warm-up runs
every bucket once, and the switches turn both off."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import Request, SamplingParams
from andante.exec.batch import StepBatch
from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
from andante.exec.torch_layers import packed_gemm_supported
from andante.exec.torch_warmup import (
    PRIMITIVE_CACHE_ENV,
    lm_head_thread_counts,
    primitive_cache_for,
    warmup_batch,
)
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.perf.step_sizes import NO_BUCKETS_ENV, StepBuckets, primitive_cache_entries
from tests.exec.engine_helpers import run_engine

needs_bf16 = pytest.mark.skipif(not packed_gemm_supported(torch.bfloat16),
                                reason="buckets pad the fused bf16 path only")
# lengths past the exact range (64): padded to 80, 112 and 144 rows when alone
PROMPTS = [list(range(3, 73)), list(range(100, 199)), list(range(7, 137)), [5, 9, 11]]
NUM_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_bf16(tiny_llama: Path) -> LoadedModel:
    return load_model(tiny_llama, "bfloat16")


def bf16_executor(model: LoadedModel, **options: Any) -> TorchExecutor:
    options.setdefault("warmup_tokens", None)
    options.setdefault("parallel_min_tokens", None)
    options.setdefault("layer_form", "plain")  # not timed: both executors alike
    options.setdefault("prefill_attention", "matmul")  # likewise the attention paths
    options.setdefault("decode_attention", "matmul_native")
    return TorchExecutor(model, TorchExecutorOptions(kv_cache_gib=0.01, swap_space_gib=0.0,
                                                     **options))


@needs_bf16
@pytest.mark.parametrize("form", ["plain", "epilogue"])
def test_pad_rows_leave_greedy_tokens_identical(tiny_bf16: LoadedModel, form: str) -> None:
    plain = bf16_executor(tiny_bf16, step_buckets=False, layer_form=form)
    padded = bf16_executor(tiny_bf16, warmup_tokens=256, layer_form=form)  # warm-up K/V
    assert plain.runner.buckets is None and padded.runner.buckets is not None
    assert padded.warmup.sizes  # the warm-up ran
    sizes: list[int] = []
    execute = padded.execute

    def recording(batch: StepBatch) -> Any:
        sizes.append(batch.num_tokens)
        return execute(batch)

    padded.execute = recording  # type: ignore[method-assign]
    for arrivals in (None, [0, 1, 3, 4]):
        expected, _ = run_engine(plain, PROMPTS, NUM_TOKENS, arrivals=arrivals)
        got, _ = run_engine(padded, PROMPTS, NUM_TOKENS, arrivals=arrivals)
        assert [r.output_token_ids for r in got] == [r.output_token_ids for r in expected]
    buckets = StepBuckets()
    assert any(buckets.pad(n) > n for n in sizes)  # some steps really were padded


@needs_bf16
def test_real_rows_logits_do_not_depend_on_padding(tiny_bf16: LoadedModel) -> None:
    plain = bf16_executor(tiny_bf16, step_buckets=False)
    padded = bf16_executor(tiny_bf16)
    params = SamplingParams(temperature=0.0)
    batch = StepBatch()
    for i, prompt in enumerate(PROMPTS[:3]):
        batch.add(Request(f"r{i}", prompt, params, 0.0), len(prompt), 0, True,
                  [10 * i + b for b in range(10)])
    with torch.inference_mode():
        want = plain.runner.forward(plain.inputs.build(batch))
        got = padded.runner.forward(padded.inputs.build(batch))
    assert got.shape == want.shape == (3, tiny_bf16.config.vocab_size)
    # each GEMM row depends on its own input row only; oneDNN may block a padded M
    # differently, so allow bf16 rounding, and the argmax must agree
    assert torch.allclose(got.float(), want.float(), atol=5e-2, rtol=5e-2)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@needs_bf16
def test_unbucketed_runs_exact_sizes_then_restores(tiny_bf16: LoadedModel) -> None:
    executor = bf16_executor(tiny_bf16)
    buckets = executor.runner.buckets
    with executor.unbucketed():
        assert executor.runner.buckets is None
    assert executor.runner.buckets is buckets is not None


@needs_bf16
def test_warm_up_runs_every_bucket_once(tiny_bf16: LoadedModel,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[tuple[int, int | None]] = []
    heads: list[tuple[int, int]] = []
    forward, lm_head = TorchExecutor._forward, TorchExecutor._warmup_lm_head

    def count_forward(self: TorchExecutor, batch: StepBatch,
                      num_layers: int | None = None) -> dict[int, int]:
        steps.append((batch.num_tokens, num_layers))
        return forward(self, batch, num_layers)

    def count_lm_head(self: TorchExecutor, rows: int, threads: int) -> None:
        heads.append((rows, threads))
        lm_head(self, rows, threads)

    monkeypatch.setattr(TorchExecutor, "_forward", count_forward)
    monkeypatch.setattr(TorchExecutor, "_warmup_lm_head", count_lm_head)
    executor = bf16_executor(tiny_bf16, warmup_tokens=300, warmup_seqs=20,
                             parallel_min_tokens=8, num_threads=2)
    buckets = StepBuckets()
    assert steps == [(size, 1) for size in buckets.sizes(300)]
    assert executor.warmup.sizes == tuple(buckets.sizes(300)) and executor.warmup.seconds > 0
    # LM-head buckets up to 20 rows: on both thread counts below the threshold (8)
    assert heads == [(r, t) for r in buckets.sizes(20) for t in ((1, 2) if r < 8 else (2,))]
    assert torch.get_num_threads() == executor.num_threads


@needs_bf16
def test_switches_turn_buckets_off(tiny_bf16: LoadedModel,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NO_BUCKETS_ENV, "1")
    executor = bf16_executor(tiny_bf16, warmup_tokens=64)
    assert executor.runner.buckets is None and not executor.warmup.sizes
    monkeypatch.setenv(NO_BUCKETS_ENV, "0")
    assert bf16_executor(tiny_bf16).runner.buckets is not None


def test_float32_runs_unpadded(tiny_llama: Path) -> None:
    executor = TorchExecutor(load_model(tiny_llama, "float32"), TorchExecutorOptions(
        dtype="float32", kv_cache_gib=0.01, swap_space_gib=0.0, warmup_tokens=64))
    assert executor.runner.buckets is None and not executor.warmup.sizes


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="warmup_tokens"):
        TorchExecutorOptions(warmup_tokens="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="warmup_tokens"):
        TorchExecutorOptions(warmup_tokens=0)
    with pytest.raises(ValueError, match="warmup_seqs"):
        TorchExecutorOptions(warmup_seqs=0)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 3000), max_len=st.integers(2, 600), block_size=st.sampled_from(
    [1, 16]), num_blocks=st.integers(1, 50))
def test_warmup_batch_has_the_rows_in_prompts_that_fit(rows: int, max_len: int,
                                                        block_size: int,
                                                        num_blocks: int) -> None:
    batch = warmup_batch(rows, max_len, block_size, num_blocks)
    assert batch.num_tokens == rows and all(batch.samples)
    assert all(0 < n <= max_len for n in batch.num_new_tokens)
    assert batch.num_seqs == -(-rows // max_len)
    for n, table in zip(batch.num_new_tokens, batch.block_tables, strict=True):
        assert len(table) * block_size >= n and all(0 <= b < num_blocks for b in table)


def test_lm_head_thread_counts() -> None:
    assert lm_head_thread_counts(4, 8, 2) == [1, 2]
    assert lm_head_thread_counts(8, 8, 2) == [2]
    assert lm_head_thread_counts(4, None, 2) == [2]
    assert lm_head_thread_counts(4, 8, 1) == [1]


def test_primitive_cache_capacity_is_asked_for_and_restored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRIMITIVE_CACHE_ENV, raising=False)
    with primitive_cache_for(140) as capacity:
        assert capacity == primitive_cache_entries(140) >= 140 * 10 + 1024
        assert os.environ[PRIMITIVE_CACHE_ENV] == str(capacity)
    assert PRIMITIVE_CACHE_ENV not in os.environ
    monkeypatch.setenv(PRIMITIVE_CACHE_ENV, "4096")  # the user's choice stands
    with primitive_cache_for(140) as capacity:
        assert capacity == 4096 and os.environ[PRIMITIVE_CACHE_ENV] == "4096"
    assert os.environ[PRIMITIVE_CACHE_ENV] == "4096"
