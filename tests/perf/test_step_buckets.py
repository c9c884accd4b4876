"""Step-size buckets: the bucket function's invariants, and the simulated instance
charging a bucketed step's time with no new-size setup for warmed buckets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import Request, SamplingParams
from andante.exec.batch import StepBatch
from andante.exec.sim_executor import SimExecutor
from andante.perf.catalog import get_hardware, get_model, save_hardware
from andante.perf.cost_model import CostModel
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.shape import BatchShape
from andante.perf.step_sizes import (
    NO_BUCKETS_ENV,
    StepBuckets,
    bucket_cache_sizes,
    engine_buckets,
    padded_shape,
)
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, build_simulator

BUCKETS = StepBuckets()
GPU = get_hardware("a10-24g")
CPU_LIKE = dataclasses.replace(GPU, name="cpu-like", new_size_fixed=0.004,
                               new_size_per_token=6e-5, new_size_cache=102)


def granule_at(buckets: StepBuckets, n: int) -> int:
    return next((g for bound, g in buckets.granules if n <= bound), buckets.top_granule)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 20_000), m=st.integers(1, 20_000))
def test_pad_is_the_smallest_bucket_at_or_above(n: int, m: int) -> None:
    b = BUCKETS.pad(n)
    assert n <= b < n + granule_at(BUCKETS, n)  # never less, less than a granule more
    assert BUCKETS.pad(b) == b  # a bucket is its own bucket
    if n <= m:
        assert b <= BUCKETS.pad(m)  # monotone
    if n <= BUCKETS.granules[0][0]:
        assert b == n  # decode-sized steps run as they are


@settings(max_examples=100, deadline=None)
@given(max_tokens=st.integers(1, 9000))
def test_sizes_are_every_bucket_up_to_the_limit(max_tokens: int) -> None:
    sizes = BUCKETS.sizes(max_tokens)
    assert sizes == sorted(set(sizes)) and sizes[-1] >= max_tokens
    assert len(sizes) == 1 or sizes[-2] < max_tokens
    assert {BUCKETS.pad(n) for n in range(1, max_tokens + 1)} == set(sizes)


@settings(max_examples=100, deadline=None)
@given(granules=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 8)), min_size=1,
                         max_size=4), top=st.integers(1, 64), n=st.integers(1, 2000))
def test_any_valid_table_pads_to_a_multiple_of_its_granule(
        granules: list[tuple[int, int]], top: int, n: int) -> None:
    table, bound = [], 0
    for steps, granule in granules:  # increasing bounds, each a multiple of its granule
        bound = (bound // granule + steps) * granule
        table.append((bound, granule))
    buckets = StepBuckets(tuple(table), top)
    b = buckets.pad(n)
    assert b >= n and b % granule_at(buckets, n) == 0 and buckets.pad(b) == b


def test_bad_tables_are_refused() -> None:
    for granules in (((64, 0),), ((64, 1), (32, 16)), ((100, 16),)):
        with pytest.raises(ValueError, match="granule"):
            StepBuckets(granules)
    with pytest.raises(ValueError, match="top_granule"):
        StepBuckets(top_granule=0)
    assert BUCKETS.pad(0) == 0 and BUCKETS.sizes(0) == []


def test_default_buckets_up_to_8192() -> None:
    sizes = BUCKETS.sizes(8192)
    assert sizes[:64] == list(range(1, 65)) and sizes[64:66] == [80, 96]
    assert 512 in sizes and 576 in sizes and 2304 in sizes and sizes[-1] == 8192
    assert len(sizes) == 140 and bucket_cache_sizes(140) >= 140


def test_padded_shape_pads_gemm_rows_only() -> None:
    shape = BatchShape.of([(70, 0), (1, 40), (1, 90)])
    padded = padded_shape(shape, BUCKETS)
    assert (padded.num_tokens, padded.num_sampled) == (80, 3)
    assert padded.attn_pairs == shape.attn_pairs
    assert padded.kv_tokens_read == shape.kv_tokens_read
    assert shape.num_tokens == 72  # a copy


def test_engine_buckets_follow_the_profile_and_the_switch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_BUCKETS_ENV, raising=False)
    assert engine_buckets(GPU) is None  # no new-size setup: not the CPU engine
    assert engine_buckets(CPU_LIKE) == StepBuckets()
    monkeypatch.setenv(NO_BUCKETS_ENV, "1")
    assert engine_buckets(CPU_LIKE) is None


def prefill(num_tokens: int, index: int = 0) -> StepBatch:
    batch = StepBatch()
    req = Request(f"r{index}", [1] * num_tokens, SamplingParams(max_tokens=1), 0.0)
    batch.add(req, num_tokens, 0, True, list(range(-(-num_tokens // 16))))
    return batch


def sim(hardware: object = CPU_LIKE, **options: object) -> SimExecutor:
    return SimExecutor(CostModel(get_model("smollm2-135m"), hardware), **options)  # type: ignore[arg-type]


def test_warmed_buckets_pay_no_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_BUCKETS_ENV, raising=False)
    executor = sim(warmup_tokens=512)
    cost = executor.cost_model
    assert len(executor.step_sizes) == len(BUCKETS.sizes(512))
    assert executor.step_sizes.capacity >= 92
    for n in (33, 70, 100, 257, 500):
        bucket_time = cost.step_time(padded_shape(prefill(n).shape(), BUCKETS))
        assert executor.execute(prefill(n)).duration == pytest.approx(bucket_time)
        assert bucket_time >= cost.step_time(prefill(n).shape())  # padding costs rows


def test_unwarmed_bucket_pays_setup_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_BUCKETS_ENV, raising=False)
    executor = sim()
    cost = executor.cost_model
    first = executor.execute(prefill(100)).duration
    shape = padded_shape(prefill(100).shape(), BUCKETS)
    assert first == pytest.approx(cost.step_time(shape) + cost.new_size_time(112))
    # 105 tokens share bucket 112: no setup; 113 is the next bucket: setup again
    assert executor.execute(prefill(105)).duration == pytest.approx(
        cost.step_time(padded_shape(prefill(105).shape(), BUCKETS)))
    assert executor.execute(prefill(113)).duration > cost.step_time(
        padded_shape(prefill(113).shape(), BUCKETS))


def test_without_buckets_every_new_size_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NO_BUCKETS_ENV, "1")
    executor = sim(warmup_tokens=512)
    assert executor.step_buckets is None and len(executor.step_sizes) == 0
    cost = executor.cost_model
    for n in (100, 105):
        want = cost.step_time(prefill(n).shape()) + cost.new_size_time(n)
        assert executor.execute(prefill(n)).duration == pytest.approx(want)
    gpu = sim(GPU, warmup_tokens=512)  # no setup modelled: nothing changes
    assert gpu.step_buckets is None
    assert gpu.execute(prefill(100)).duration == pytest.approx(
        gpu.cost_model.step_time(prefill(100).shape()))


def test_decode_and_prefill_runs_charge_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_BUCKETS_ENV, raising=False)
    executor = sim(warmup_tokens=512)
    cost = executor.cost_model
    shapes = [prefill(n).shape() for n in (70, 90)]
    assert executor.prefill_run_durations(shapes, 1e9) == pytest.approx(
        [cost.step_time(padded_shape(s, BUCKETS)) for s in shapes])
    batch = StepBatch()
    for i in range(70):
        req = Request(f"d{i}", [1] * 20, SamplingParams(max_tokens=9), 0.0)
        req.num_computed_tokens = 20
        batch.add(req, 1, 20, True, [0, 1])
    runs = executor.decode_run_durations(batch, 3, 1e9)
    want = cost.decode_step_times(padded_shape(BatchShape.decode(70, 20), BUCKETS), 3)
    assert runs == pytest.approx(want)


def test_simulated_instance_is_warmed_to_its_context(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path))
    monkeypatch.delenv(NO_BUCKETS_ENV, raising=False)
    save_hardware(CPU_LIKE)
    spec = ClusterSpec(model="smollm2-135m", hardware=CPU_LIKE.name,
                       scheduler=SchedulerConfig(max_model_len=2048))
    executor = build_simulator(spec).instances[0].engine.executor
    assert isinstance(executor, SimExecutor) and executor.step_buckets == BUCKETS
    assert all(not executor.step_sizes.is_new(n) for n in BUCKETS.sizes(2048))
