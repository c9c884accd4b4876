"""Decode attention on one thread while the step's GEMMs use all (andante.exec.
thread_scope): the scriptable thread switch, the start-up rule, and the same greedy
tokens either way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from andante.exec import thread_scope  # noqa: F401 (registers torch.ops.andante.set_threads)
from andante.exec.torch_attention import (
    CHOICE_BATCHES,
    decode_threads_choice,
    one_thread_below,
)
from andante.exec.torch_executor import TorchExecutorOptions
from andante.exec.torch_threads import probe_batch
from andante.models import load_model
from andante.models.torchscript import script
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import hf_greedy

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7]]
NUM_TOKENS = 12


@pytest.fixture
def two_threads() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@script
def _doubled_on(x: torch.Tensor, threads: int) -> tuple[torch.Tensor, int]:
    previous = torch.ops.andante.set_threads(threads)
    y = x * 2
    inside = torch.ops.andante.set_threads(previous)
    return y, inside


def test_the_switch_works_inside_torchscript_and_restores(two_threads: None) -> None:
    y, inside = _doubled_on(torch.ones(3), 1)
    assert inside == 1 and torch.get_num_threads() == 2 and y.tolist() == [2.0] * 3
    assert torch.ops.andante.set_threads(0) == 2 and torch.get_num_threads() == 2


@pytest.mark.parametrize("timings,expected", [
    ({1: (10.0, 20.0), 8: (30.0, 40.0), 16: (50.0, 60.0)}, 17),  # one thread always wins
    ({1: (20.0, 10.0), 8: (40.0, 30.0), 16: (60.0, 50.0)}, 1),  # all threads always win
    ({1: (10.0, 20.0), 8: (30.0, 40.0), 16: (60.0, 50.0)}, 16),
    ({1: (10.0, 20.0), 8: (40.0, 30.0), 16: (50.0, 60.0)}, 17),  # not monotone: the top
])
def test_one_thread_below_the_smallest_batch_all_threads_win_from(
        timings: dict[int, tuple[float, float]], expected: int) -> None:
    assert one_thread_below(timings) == expected


def test_the_choice_times_both_counts_or_takes_the_option(two_threads: None) -> None:
    shape = (4, 2, 16, torch.float32, 16, "matmul")
    assert decode_threads_choice("all", *shape, 2) == (0, {})
    assert decode_threads_choice("one", *shape, 2)[0] > max(CHOICE_BATCHES)
    assert decode_threads_choice("auto", *shape, 1) == (0, {})
    below, timings = decode_threads_choice("auto", *shape, 2)
    assert set(timings) == set(CHOICE_BATCHES)
    assert all(one > 0 and every > 0 for one, every in timings.values())
    assert below == one_thread_below(timings) and torch.get_num_threads() == 2


def test_a_bad_option_is_refused() -> None:
    with pytest.raises(ValueError, match="decode_attention_threads"):
        TorchExecutorOptions(decode_attention_threads="half")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_tokens_are_the_same_on_one_thread(tiny_llama: Path, dtype: str,
                                                  two_threads: None) -> None:
    model = load_model(tiny_llama, dtype)
    runs = {}
    for option in ("one", "all"):
        executor = tiny_executor(model, dtype=dtype, num_threads=2, parallel_min_tokens=None,
                                 adapt_threads=False, decode_attention_threads=option)
        decode = executor.inputs.build(probe_batch(3, 16, 20))
        assert decode.decode_threads == (1 if option == "one" else 0)
        requests, _ = run_engine(executor, PROMPTS, NUM_TOKENS)
        runs[option] = [list(r.output_token_ids) for r in requests]
        assert torch.get_num_threads() == 2  # every step's count, restored after attention
    assert runs["one"] == runs["all"]
    if dtype == "float32":
        assert runs["one"] == hf_greedy(tiny_llama, PROMPTS, NUM_TOKENS)
