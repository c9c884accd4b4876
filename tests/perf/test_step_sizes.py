"""The setup of a new step size: the LRU of sizes, its fit, the profile fields, and the
simulator charging it once per size and instance."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.exec.sim_executor import SimExecutor
from andante.perf.catalog import get_hardware, get_model, save_hardware
from andante.perf.cost_model import CostModel
from andante.perf.fit import fit_new_size
from andante.perf.shape import BatchShape
from andante.perf.specs import HardwareSpec
from andante.perf.step_sizes import StepSizeCache, default_cache_sizes

_SETUP = dataclasses.replace(get_hardware("a10-24g"), name="cpu-like", new_size_fixed=0.004,
                             new_size_per_token=6e-5, new_size_cache=3)


def test_the_cache_is_an_lru_of_sizes() -> None:
    cache = StepSizeCache(2)
    assert cache.is_new(8) and cache.miss(8) and not cache.is_new(8)
    assert not cache.miss(8) and cache.miss(16) and len(cache) == 2
    assert not cache.miss(8)  # 8 is now the most recent: 16 goes first
    assert cache.miss(32) and 16 not in cache and 8 in cache
    off = StepSizeCache(0)
    assert not off.is_new(8) and not off.miss(8) and len(off) == 0
    with pytest.raises(ValueError, match="capacity"):
        StepSizeCache(-1)


@settings(max_examples=50, deadline=None)
@given(capacity=st.integers(1, 6), sizes=st.lists(st.integers(1, 10), max_size=60))
def test_misses_are_those_of_a_reference_lru(capacity: int, sizes: list[int]) -> None:
    cache, recent, misses = StepSizeCache(capacity), [], []
    for size in sizes:
        misses.append(cache.miss(size))
        hit = size in recent
        if hit:
            recent.remove(size)
        recent.append(size)
        del recent[:-capacity]
        assert misses[-1] == (not hit)
    assert len(cache) == len(recent) and all(s in cache for s in recent)


def test_cache_sizes_follow_the_primitive_cache() -> None:
    assert default_cache_sizes() == 102 and default_cache_sizes(3) == 1
    with pytest.raises(ValueError):
        default_cache_sizes(0)


def test_the_fit_recovers_fixed_and_per_token_setup() -> None:
    pairs = [(n, 0.004 + 6e-5 * n) for n in (33, 70, 135, 260, 520)]
    fixed, per_token = fit_new_size(pairs)
    assert fixed == pytest.approx(0.004) and per_token == pytest.approx(6e-5)
    assert fit_new_size([]) == (0.0, 0.0)
    assert fit_new_size([(50, -0.002), (100, -0.001)]) == (0.0, 0.0)  # never a saving
    with pytest.raises(ValueError, match="new-size"):
        fit_new_size([(0, 0.01)])


def test_profiles_keep_the_setup_and_old_ones_have_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    save_hardware(_SETUP, tmp_path)
    assert get_hardware("cpu-like", tmp_path) == _SETUP
    old = _SETUP.to_dict()
    for key in ("new_size_fixed", "new_size_per_token", "new_size_cache"):
        del old[key]
    assert HardwareSpec.from_dict(old).new_size_cache == 0
    with pytest.raises(ValueError, match="new_size_per_token"):
        dataclasses.replace(_SETUP, new_size_per_token=-1.0)
    with pytest.raises(ValueError, match="new_size_cache"):
        dataclasses.replace(_SETUP, new_size_cache=-2)


def test_the_cost_model_prices_a_new_size() -> None:
    model = get_model("llama-3.1-8b")
    assert CostModel(model, get_hardware("a10-24g")).new_size_time(100) == 0.0
    cost = CostModel(model, _SETUP)
    assert cost.new_size_time(100) == pytest.approx(0.004 + 0.006)
    assert cost.new_size_time(0) == 0.0


def test_the_simulated_executor_charges_each_size_once_until_evicted() -> None:
    cost = CostModel(get_model("llama-3.1-8b"), _SETUP)
    executor = SimExecutor(cost, step_buckets=None)  # the unbucketed engine
    shapes = {n: BatchShape.of([(n, 0)]) for n in (40, 50, 60, 70)}

    def extra(n: int) -> float:
        from andante.core import Request, SamplingParams
        from andante.exec.batch import StepBatch

        batch = StepBatch()
        batch.add(Request(f"r{n}", [1] * n, SamplingParams(max_tokens=4), 0.0), n, 0, True,
                  [0])
        return executor.execute(batch).duration - cost.step_time(shapes[n])

    assert extra(40) == pytest.approx(cost.new_size_time(40))
    assert extra(40) == 0.0
    for n in (50, 60, 70):  # three more sizes: 40 leaves the cache of three
        assert extra(n) == pytest.approx(cost.new_size_time(n))
    assert extra(40) == pytest.approx(cost.new_size_time(40))


def test_runs_of_steps_stop_before_a_new_size() -> None:
    cost = CostModel(get_model("llama-3.1-8b"), _SETUP)
    executor = SimExecutor(cost, step_buckets=None)
    executor.step_sizes.warm([10, 11])
    shapes = [BatchShape.of([(9, 0), (1, 50)]), BatchShape.of([(10, 0), (1, 51)]),
              BatchShape.of([(20, 0), (1, 52)])]
    # 10 tokens is warm, 11 too; 21 is new: that step is left to `execute`
    assert executor.prefill_run_durations(shapes, 10.0) == [cost.step_time(s)
                                                             for s in shapes[:2]]
    assert executor.prefill_run_durations(shapes[2:], 10.0) == []
    assert executor.step_sizes.is_new(21)
    no_setup = SimExecutor(CostModel(get_model("llama-3.1-8b"), get_hardware("a10-24g")))
    assert len(no_setup.prefill_run_durations(shapes, 10.0)) == 3


def test_a_pair_hit_by_outside_load_does_not_move_the_fit() -> None:
    pairs = [(n, 0.004 + 6e-5 * n + (1e-4 if n % 2 else -1e-4))
             for n in (33, 64, 70, 129, 135, 257, 262, 513)]
    clean = fit_new_size(pairs)
    pairs[3] = (129, 0.25)  # a 250 ms stall
    assert fit_new_size(pairs) == pytest.approx(clean, rel=0.05)
