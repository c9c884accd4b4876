"""The start-up measurement of when a step uses all threads (andante.exec.torch_threads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from andante.exec import torch_threads
from andante.exec.cpu_share import CpuTimes
from andante.exec.torch_threads import (
    PROBE_BATCHES,
    REPROBE_ENV,
    ThreadChoice,
    _threshold,
    cache_path,
    cached_thread_choice,
    machine_is_busy,
    probe_batch,
    probe_key,
)
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


# ---- the cached choice ---------------------------------------------------------------

@pytest.fixture(autouse=True)
def _own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test caches its thread choices in a fresh andante home."""
    monkeypatch.setenv("ANDANTE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(REPROBE_ENV, raising=False)
    monkeypatch.setattr(torch_threads, "machine_load", lambda: 0.0)
    monkeypatch.setattr(torch_threads, "read_cpu_times", StatReader(0.0))  # a quiet machine
    return tmp_path / "home"


class StatReader:
    """/proc/stat readings around a probe: 100 s of capacity pass between two calls,
    during which the probe uses 1 s and others `others` x 100 s."""

    def __init__(self, others: float) -> None:
        self.others = others
        self.calls = 0

    def __call__(self) -> CpuTimes:
        self.calls += 1
        n = self.calls
        return CpuTimes(busy=n * (1.0 + 100 * self.others), total=n * 100.0, own=float(n))


class CountingProbe:
    def __init__(self, threshold: int | None = 8) -> None:
        self.calls = 0
        self.threshold = threshold

    def __call__(self) -> ThreadChoice:
        self.calls += 1
        return ThreadChoice(self.threshold, {1: (2.0, 3.0), 8: (9.0, 6.0), 16: (14.0, 8.0)},
                            "measured")


def _key(threads: int = 2, layers: int = 30) -> dict[str, object]:
    return probe_key({"layers": layers, "hidden": 576}, threads)


def test_a_choice_is_measured_once_then_read_from_the_cache() -> None:
    probe = CountingProbe()
    first = cached_thread_choice(probe, _key())
    second = cached_thread_choice(probe, _key())
    assert probe.calls == 1
    assert first.source.startswith("measured") and second.source.startswith("cached")
    assert (second.parallel_min_tokens, second.timings) == (8, first.timings)
    assert cache_path(_key()).is_file()
    assert "steps under 8 tokens run on one thread" in second.describe()


def test_a_probe_beside_other_work_is_used_but_not_cached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Others' CPU share measured from /proc/stat during the probe decides, even while
    the lagging load average still says the machine is quiet."""
    monkeypatch.setattr(torch_threads, "read_cpu_times", StatReader(0.5))
    probe = CountingProbe()
    busy = cached_thread_choice(probe, _key())
    assert busy.parallel_min_tokens == 8 and "not cached" in busy.source
    assert "others' CPU share 0.50" in busy.source
    assert not cache_path(_key()).exists()
    monkeypatch.setattr(torch_threads, "read_cpu_times", StatReader(0.02))
    assert cached_thread_choice(probe, _key()).source.startswith("measured")
    assert cached_thread_choice(probe, _key()).source.startswith("cached")
    assert probe.calls == 2


def test_an_injected_stat_reader_is_used() -> None:
    reader = StatReader(0.3)
    choice = cached_thread_choice(CountingProbe(), _key(), cpu_times=reader)
    assert reader.calls == 2 and "not cached" in choice.source


def test_without_proc_stat_the_load_average_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_threads, "read_cpu_times", lambda: None)
    monkeypatch.setattr(torch_threads, "machine_load", lambda: float(os.cpu_count() or 1))
    assert "not cached" in cached_thread_choice(CountingProbe(), _key()).source
    monkeypatch.setattr(torch_threads, "machine_load", lambda: 0.0)
    assert "cached in" in cached_thread_choice(CountingProbe(), _key()).source


def test_busy_means_half_the_cores_loaded() -> None:
    assert not machine_is_busy(0.9, cores=2) and machine_is_busy(1.0, cores=2)
    assert not machine_is_busy(3.9, cores=8) and machine_is_busy(4.0, cores=8)


def test_a_choice_of_all_threads_is_cached_too() -> None:
    probe = CountingProbe(threshold=None)
    cached_thread_choice(probe, _key())
    assert cached_thread_choice(probe, _key()).parallel_min_tokens is None
    assert probe.calls == 1


def test_reprobe_measures_again_and_replaces_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    cached_thread_choice(CountingProbe(8), _key())
    again = CountingProbe(16)
    assert cached_thread_choice(again, _key(), reprobe=True).parallel_min_tokens == 16
    monkeypatch.setenv(REPROBE_ENV, "1")
    assert cached_thread_choice(again, _key()).parallel_min_tokens == 16
    assert again.calls == 2
    monkeypatch.setenv(REPROBE_ENV, "0")
    assert cached_thread_choice(again, _key()).source.startswith("cached")
    assert again.calls == 2


def test_another_machine_or_model_shape_is_another_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    probe = CountingProbe()
    cached_thread_choice(probe, _key())
    cached_thread_choice(probe, _key(threads=4))
    cached_thread_choice(probe, _key(layers=12))
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    cached_thread_choice(probe, _key())
    assert probe.calls == 4


@pytest.mark.parametrize("content", ["not json", '{"key": 1}', "[]",
                                     '{"key": null, "parallel_min_tokens": 0}'])
def test_a_damaged_entry_is_measured_again(content: str) -> None:
    path = cache_path(_key())
    path.parent.mkdir(parents=True)
    path.write_text(content)
    probe = CountingProbe()
    assert cached_thread_choice(probe, _key()).parallel_min_tokens == 8
    assert probe.calls == 1
    assert cached_thread_choice(probe, _key()).source.startswith("cached")


def test_an_unwritable_home_still_measures(_own_home: Path) -> None:
    _own_home.write_text("a file where the home directory should be")
    probe = CountingProbe()
    assert cached_thread_choice(probe, _key()).parallel_min_tokens == 8
    assert cached_thread_choice(probe, _key()).parallel_min_tokens == 8
    assert probe.calls == 2


def test_the_executor_reuses_its_cached_choice(tiny_llama: Path) -> None:
    model = load_model(tiny_llama, "float32")
    before = torch.get_num_threads()
    try:
        first = tiny_executor(model, num_threads=2, parallel_min_tokens="auto").thread_choice
        second = tiny_executor(model, num_threads=2, parallel_min_tokens="auto").thread_choice
        third = tiny_executor(model, num_threads=2, parallel_min_tokens="auto",
                              reprobe_threads=True).thread_choice
    finally:
        torch.set_num_threads(before)
    assert first.source.startswith("measured") and third.source.startswith("measured")
    assert second.source.startswith("cached")
    assert (second.parallel_min_tokens, second.timings) == (first.parallel_min_tokens,
                                                            first.timings)


def test_the_executor_follows_its_thread_adapter(tiny_llama: Path) -> None:
    """Steps run at the adapter's choice for their size class, and a drift it sees
    (injected durations, not timings) moves that class to one thread."""
    from andante.exec.thread_adapter import TRIALS, WINDOW

    model = load_model(tiny_llama, "float32")
    before = torch.get_num_threads()
    try:
        executor = tiny_executor(model, num_threads=2, parallel_min_tokens=1)
        assert executor.thread_adapter is None  # a set threshold does not adapt
        executor = tiny_executor(model, num_threads=2, parallel_min_tokens="auto")
        adapter = executor.thread_adapter
        assert adapter is not None
        size, threads = executor._set_threads(100)  # no buckets on float32: 128
        assert size == 128 and threads == executor._rule_threads(128)
        for seconds in [0.01] * (2 * WINDOW) + [0.05] * WINDOW:
            executor._observe(size, threads, seconds)
        for _ in range(2 * (TRIALS + 1)):  # the re-probe: one thread wins
            size, trial = executor._set_threads(100)
            executor._observe(size, trial, 0.01 if trial == 1 else 0.05)
        assert executor._set_threads(100) == (128, 1) and torch.get_num_threads() == 1
        assert executor._set_threads(8)[1] == executor._rule_threads(8)
    finally:
        torch.set_num_threads(before)
