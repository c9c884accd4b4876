"""Decode-only steps fitted apart, with a KV-read term (andante.perf.fit.fit_by_kind)."""

import dataclasses
import random

import pytest

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.fit import MIN_DECODE_SAMPLES, fit_by_kind, is_decode_only, prediction_error
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients, HardwareSpec

PREFILL_TRUTH = CostCoefficients(c2=0.9, c4=1.3, c5=0.05)
DECODE_TRUTH = CostCoefficients(c2=1.3, c4=2.0, c5=0.002, c6=1.7)


@pytest.fixture
def base() -> CostModel:
    return CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))


def _two_kinds(base: CostModel) -> CostModel:
    hw = dataclasses.replace(base.hardware, coefficients=PREFILL_TRUTH,
                             decode_coefficients=DECODE_TRUTH)
    return CostModel(base.model, hw)


def _shapes(seed: int) -> tuple[list[BatchShape], list[BatchShape]]:
    rng = random.Random(seed)
    decodes = [BatchShape.decode(rng.randint(1, 32), rng.randint(16, 2048)) for _ in range(40)]
    prefills = [BatchShape.of([(rng.randint(16, 1024), 0)]
                              + [(1, rng.randint(16, 1024))] * rng.randint(0, 8))
                for _ in range(40)]
    return decodes, prefills


def test_decode_coefficients_apply_to_decode_only_steps(base):
    model = _two_kinds(base)
    decode, mixed = BatchShape.decode(4, 300), BatchShape.of([(64, 0), (1, 300)])
    assert is_decode_only(decode) and not is_decode_only(mixed)
    t_m, t_f = base.terms(decode)
    expected = 1.3 * max(t_m, t_f) + 2.0 * t_f + 0.002 + 1.7 * base.kv_read_time(decode)
    assert model.step_time(decode) == pytest.approx(expected, rel=1e-12)
    assert model.step_time(mixed) == pytest.approx(
        base.with_coefficients(PREFILL_TRUTH).step_time(mixed), rel=1e-12)
    # explicit coefficients (an online refit) stand for every step kind
    assert model.with_coefficients(PREFILL_TRUTH).step_time(decode) == pytest.approx(
        base.with_coefficients(PREFILL_TRUTH).step_time(decode), rel=1e-12)


def test_fit_by_kind_recovers_both_sets(base):
    truth = _two_kinds(base)
    decodes, prefills = _shapes(0)
    samples = [(s, truth.step_time(s)) for s in decodes + prefills]
    other, decode = fit_by_kind(base, samples)
    assert decode is not None
    assert other.as_tuple() + (other.c6,) == pytest.approx(
        PREFILL_TRUTH.as_tuple() + (0.0,), rel=1e-6, abs=1e-9)
    # A decode step's tM, tF, 1 and tKV span only (1, batch, KV read): its coefficients
    # are not identifiable one by one, its predictions are.
    assert decode.c6 > 0.0
    fitted = dataclasses.replace(base.hardware, coefficients=other, decode_coefficients=decode)
    assert prediction_error(CostModel(base.model, fitted), samples) < 1e-9


def test_one_set_beats_no_split_only_when_kinds_differ(base):
    # Where decode and prefill steps follow different laws, one set cannot fit both.
    truth = _two_kinds(base)
    decodes, prefills = _shapes(1)
    samples = [(s, truth.step_time(s)) for s in decodes + prefills]
    other, decode = fit_by_kind(base, samples)
    single = fit_by_kind(base, [s for s in samples if not is_decode_only(s[0])]
                         + [s for s in samples if is_decode_only(s[0])][:2])
    assert single[1] is None  # too few decode-only steps: one set for all
    split_error = prediction_error(CostModel(base.model, dataclasses.replace(
        base.hardware, coefficients=other, decode_coefficients=decode)), samples)
    one_error = prediction_error(base.with_coefficients(single[0]), samples)
    assert split_error < 1e-9 < 0.02 < one_error


def test_too_few_decode_steps_fit_one_set(base):
    decodes, prefills = _shapes(2)
    truth = base.with_coefficients(PREFILL_TRUTH)
    samples = [(s, truth.step_time(s)) for s in decodes[:MIN_DECODE_SAMPLES - 1] + prefills]
    other, decode = fit_by_kind(base, samples)
    assert decode is None
    assert other.as_tuple() == pytest.approx(PREFILL_TRUTH.as_tuple(), rel=1e-6, abs=1e-9)


def test_profile_with_decode_coefficients_round_trips(base):
    hw = dataclasses.replace(base.hardware, name="cpu-x", coefficients=PREFILL_TRUTH,
                             decode_coefficients=DECODE_TRUTH)
    assert HardwareSpec.from_json(hw.to_json()) == hw
    older = hw.to_dict()
    del older["decode_coefficients"]
    del older["coefficients"]["c6"]
    assert HardwareSpec.from_dict(older).decode_coefficients is None
    with pytest.raises(ValueError, match="decode_coefficients"):
        dataclasses.replace(hw, decode_coefficients={"c2": 1.0})
