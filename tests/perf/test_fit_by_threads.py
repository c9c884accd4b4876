"""Steps run on one thread fitted apart, with a KV-read term (fit.fit_by_threads)."""

import dataclasses
import random

import pytest

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.fit import MIN_REGIME_SAMPLES, fit_by_threads, prediction_error
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients, HardwareSpec

PARALLEL_TRUTH = CostCoefficients(c2=0.9, c4=1.3, c5=0.05, c6=0.4)
SERIAL_TRUTH = CostCoefficients(c2=1.3, c4=2.0, c5=0.002, c6=1.7)
BELOW = 16


@pytest.fixture
def base() -> CostModel:
    return CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))


def _two_regimes(base: CostModel) -> CostModel:
    hw = dataclasses.replace(base.hardware, coefficients=PARALLEL_TRUTH,
                             serial_coefficients=SERIAL_TRUTH, serial_below_tokens=BELOW)
    return CostModel(base.model, hw)


def _samples(model: CostModel, seed: int) -> list[tuple[BatchShape, float]]:
    rng = random.Random(seed)
    shapes = [BatchShape.decode(rng.randint(1, 64), rng.randint(16, 2048)) for _ in range(60)]
    shapes += [BatchShape.of([(rng.randint(2, 1024), 0)]
                             + [(1, rng.randint(16, 1024))] * rng.randint(0, 8))
               for _ in range(60)]
    return [(s, model.step_time(s)) for s in shapes]


def test_serial_coefficients_apply_below_the_threshold(base):
    model = _two_regimes(base)
    small, large = BatchShape.decode(BELOW - 1, 300), BatchShape.decode(BELOW, 300)
    t_m, t_f = base.terms(small)
    expected = 1.3 * max(t_m, t_f) + 2.0 * t_f + 0.002 + 1.7 * base.kv_read_time(small)
    assert model.step_time(small) == pytest.approx(expected, rel=1e-12)
    assert model.step_time(large) == pytest.approx(
        base.with_coefficients(PARALLEL_TRUTH).step_time(large), rel=1e-12)
    # explicit coefficients (an online refit) stand for every step
    assert model.with_coefficients(PARALLEL_TRUTH).step_time(small) == pytest.approx(
        base.with_coefficients(PARALLEL_TRUTH).step_time(small), rel=1e-12)


def test_fit_by_threads_recovers_both_regimes(base):
    samples = _samples(_two_regimes(base), 0)
    parallel, serial = fit_by_threads(base, samples, BELOW)
    assert serial is not None
    fitted = dataclasses.replace(base.hardware, coefficients=parallel,
                                 serial_coefficients=serial, serial_below_tokens=BELOW)
    assert prediction_error(CostModel(base.model, fitted), samples) < 1e-6
    # one set cannot fit two regimes
    single, none = fit_by_threads(base, samples, None)
    assert none is None
    assert prediction_error(base.with_coefficients(single), samples) > 0.02


def test_too_few_steps_in_a_regime_fit_one_set(base):
    samples = _samples(base.with_coefficients(PARALLEL_TRUTH), 2)
    few_serial = [s for s in samples if s[0].num_tokens >= BELOW]
    few_serial += [s for s in samples if s[0].num_tokens < BELOW][:MIN_REGIME_SAMPLES - 1]
    parallel, serial = fit_by_threads(base, few_serial, BELOW)
    assert serial is None
    assert prediction_error(base.with_coefficients(parallel), few_serial) < 1e-6


def test_profile_with_serial_coefficients_round_trips(base):
    hw = dataclasses.replace(base.hardware, name="cpu-x", coefficients=PARALLEL_TRUTH,
                             serial_coefficients=SERIAL_TRUTH, serial_below_tokens=BELOW)
    assert HardwareSpec.from_json(hw.to_json()) == hw
    older = hw.to_dict()  # a profile saved before thread regimes and c6
    del older["serial_coefficients"], older["serial_below_tokens"]
    del older["coefficients"]["c6"]
    assert HardwareSpec.from_dict(older).serial_coefficients is None
    with pytest.raises(ValueError, match="together"):
        dataclasses.replace(hw, serial_below_tokens=None)
    with pytest.raises(ValueError, match="serial_coefficients"):
        dataclasses.replace(hw, serial_coefficients={"c2": 1.0})
