"""The start-up measurement of when a step uses all threads (andante.exec.torch_threads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from andante.exec.torch_threads import PROBE_BATCHES, _threshold, probe_batch
from andante.models import load_model
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import hf_greedy


def test_threshold_is_where_all_threads_start_winning_for_good() -> None:
    assert _threshold({1: (10.0, 8.0), 8: (20.0, 12.0), 16: (30.0, 15.0)}) == 1
    assert _threshold({1: (10.0, 12.0), 8: (20.0, 12.0), 16: (30.0, 15.0)}) == 8
    # a win at 1 does not count when 8 loses: one thread up to 16
    assert _threshold({1: (10.0, 8.0), 8: (20.0, 22.0), 16: (30.0, 15.0)}) == 16
    assert _threshold({1: (10.0, 12.0), 8: (20.0, 22.0), 16: (30.0, 31.0)}) == 32


def test_probe_batch_is_one_decode_token_per_request() -> None:
    batch = probe_batch(3, 16, 40)
    assert batch.num_new_tokens == [1, 1, 1]
    assert batch.num_cached_tokens == [40, 40, 40]
    assert all(table == [0, 1, 2] for table in batch.block_tables)


def test_measured_choice_leaves_outputs_identical(tiny_llama: Path) -> None:
    model = load_model(tiny_llama, "float32")
    prompts = [[5, 17, 33, 200, 12], list(range(10, 60))]
    before = torch.get_num_threads()
    try:
        executor = tiny_executor(model, num_threads=2, parallel_min_tokens="auto")
        choice = executor.thread_choice
        assert set(choice.timings) == set(PROBE_BATCHES)
        assert choice.parallel_min_tokens == _threshold(choice.timings)
        requests, _ = run_engine(executor, prompts, 8)
    finally:
        torch.set_num_threads(before)
    assert [list(r.output_token_ids) for r in requests] == hf_greedy(tiny_llama, prompts, 8)


def test_bad_parallel_min_tokens_is_refused() -> None:
    from andante.exec.torch_executor import TorchExecutorOptions

    with pytest.raises(ValueError, match="auto"):
        TorchExecutorOptions(parallel_min_tokens="sometimes")  # type: ignore[arg-type]
