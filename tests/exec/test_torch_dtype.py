"""The measured serving dtype (andante.exec.torch_dtype): agreement, the rule, the cache,
and the greedy answers of a real executor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from andante.exec import torch_dtype
from andante.exec.cpu_share import CpuTimes
from andante.exec.torch_dtype import (
    MIN_SPEEDUP,
    DtypeChoice,
    _Probe,
    cached_dtype_choice,
    decide,
    dtype_key,
    measure_dtype_choice,
    prefix_agreement,
)
from andante.models import load_model
from tests.exec.engine_helpers import tiny_executor
from tests.models.helpers import hf_greedy


@pytest.fixture(autouse=True)
def _own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ANDANTE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_prefix_agreement_counts_tokens_before_the_first_divergence() -> None:
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert prefix_agreement(ref, ref) == 1.0
    assert prefix_agreement(ref, [[1, 2, 9, 4], [5, 6, 7, 8]]) == 6 / 8  # 4 after 9 lost
    assert prefix_agreement(ref, [[0, 2, 3, 4], [0, 6, 7, 8]]) == 0.0


def test_bf16_needs_both_agreement_and_speed() -> None:
    fast = {"float32": 100.0, "bfloat16": 100.0 / MIN_SPEEDUP - 1}
    slow = {"float32": 100.0, "bfloat16": 95.0}
    assert decide(1.0, fast) == "bfloat16"
    assert decide(1.0, slow) == "float32"
    assert decide(0.5, fast) == "float32"


class FakeExecutor:
    """Answers token (position + offset) % 50 and takes `ms` of injected time."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.calls = 0

    def execute(self, batch: object) -> object:
        self.calls += 1
        req = batch.requests[0]  # type: ignore[attr-defined]
        token = (req.num_tokens + self.offset) % 50

        class Result:
            sampled_token_ids = [token] * len(batch.requests)  # type: ignore[attr-defined]
        return Result()


def test_measurement_compares_the_answers_of_both_dtypes() -> None:
    same = measure_dtype_choice({"float32": FakeExecutor(0), "bfloat16": FakeExecutor(0)},
                                [[1, 2, 3], [4, 5]], 16)
    assert same.agreement == 1.0 and set(same.ms) == {"float32", "bfloat16"}
    other = measure_dtype_choice({"float32": FakeExecutor(0), "bfloat16": FakeExecutor(1)},
                                 [[1, 2, 3]], 16)
    assert other.agreement == 0.0 and other.dtype == "float32"


class CountingMeasure:
    def __init__(self, dtype: str = "bfloat16") -> None:
        self.calls = 0
        self.dtype = dtype

    def __call__(self) -> DtypeChoice:
        self.calls += 1
        return DtypeChoice(self.dtype, 0.95, {"float32": 100.0, "bfloat16": 50.0})


def _idle() -> CpuTimes:
    return CpuTimes(0.0, 0.0, 0.0)


class Stat:
    """/proc/stat readings: each call 1 s of capacity passes, others using `shares[i]`
    of it in the i-th interval."""

    def __init__(self, *shares: float) -> None:
        self.shares = list(shares)
        self.now = CpuTimes(0.0, 0.0, 0.0)
        self.calls = 0

    def __call__(self) -> CpuTimes:
        share = self.shares[min(self.calls // 2, len(self.shares) - 1)]
        if self.calls % 2:  # the end of an interval
            self.now = CpuTimes(self.now.busy + share, self.now.total + 1.0, self.now.own)
        self.calls += 1
        return self.now


def _no_sleep(seconds: float) -> None:
    pass


def _choice(measure: CountingMeasure, key: dict[str, object], stat: object = _idle
            ) -> DtypeChoice:
    return cached_dtype_choice(measure, key, "bfloat16", stat, _no_sleep)  # type: ignore[arg-type]


def test_the_choice_is_measured_once_per_machine_and_model(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    measure = CountingMeasure()
    first = _choice(measure, dtype_key(model))
    second = _choice(measure, dtype_key(model))
    assert measure.calls == 1 and first.source.startswith("measured")
    assert second.source.startswith("cached") and second.dtype == "bfloat16"
    model.write_bytes(b"another model")  # another file: again
    _choice(measure, dtype_key(model))
    assert measure.calls == 2


def test_a_damaged_entry_is_measured_again(tmp_path: Path) -> None:
    key = dtype_key(tmp_path / "absent")
    path = torch_dtype._cache_path(key)
    path.parent.mkdir(parents=True)
    path.write_text('{"key": 1, "dtype": "float16"}')
    measure = CountingMeasure("float32")
    assert _choice(measure, key).dtype == "float32"
    assert measure.calls == 1


def test_a_busy_machine_gets_the_rule_without_a_measurement(tmp_path: Path) -> None:
    measure = CountingMeasure("float32")
    choice = _choice(measure, dtype_key(tmp_path), Stat(0.5))
    assert measure.calls == 0 and choice.dtype == "bfloat16"
    assert "not measured" in choice.source and "0.50" in choice.source
    assert _choice(measure, dtype_key(tmp_path), Stat(0.0)).source.startswith("measured")
    assert measure.calls == 1


def test_a_neighbour_during_the_measurement_keeps_it_out_of_the_cache(tmp_path: Path) -> None:
    measure = CountingMeasure("float32")
    choice = _choice(measure, dtype_key(tmp_path), Stat(0.0, 0.6))
    assert choice.dtype == "float32" and "not cached" in choice.source
    _choice(measure, dtype_key(tmp_path), Stat(0.0))
    assert measure.calls == 2


def test_greedy_answers_of_the_probe_are_the_reference_model_s(tiny_llama: Path) -> None:
    """The probe's step-by-step greedy decoding is the model's own (float32)."""
    model = load_model(tiny_llama, "float32")
    prompts = [[5, 17, 33, 200, 12], list(range(10, 40))]
    probe = _Probe(tiny_executor(model, parallel_min_tokens=None, warmup_tokens=None), 16)
    assert [probe.greedy(p, 6) for p in prompts] == hf_greedy(tiny_llama, prompts, 6)


def test_a_real_measurement_on_a_tiny_model(tiny_llama: Path) -> None:
    model = load_model(tiny_llama, "float32")
    executors = {d: tiny_executor(model, dtype=d, parallel_min_tokens=None,
                                  warmup_tokens=None, num_threads=1)
                 for d in ("float32", "bfloat16")}
    before = torch.get_num_threads()
    try:
        choice = measure_dtype_choice(executors, [[5, 17, 33], [40, 41, 42, 43]], 16)
    finally:
        torch.set_num_threads(before)
    assert 0.0 <= choice.agreement <= 1.0
    assert choice.dtype == decide(choice.agreement, choice.ms)
    assert all(ms > 0 for ms in choice.ms.values())
