"""§5.1: the online performance model refits the regression and reports its error."""

from __future__ import annotations

import numpy as np
import pytest

from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients
from andante.policies.ascendra import OnlinePerfModel
from tests.policies.ascendra_helpers import cost_model


def _shapes(n: int, seed: int = 0) -> list[BatchShape]:
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(n):
        chunks = [(1, int(rng.integers(50, 3000))) for _ in range(int(rng.integers(0, 64)))]
        if not chunks or rng.random() < 0.4:
            chunks.append((int(rng.integers(16, 2048)), 0))
        shapes.append(BatchShape.of(chunks))
    return shapes


def test_refit_recovers_the_true_model_from_a_wrong_prior() -> None:
    truth = cost_model()
    prior = truth.with_coefficients(CostCoefficients(c2=1.0))
    model = OnlinePerfModel(prior, refit_every=50, min_samples=20)
    shapes = _shapes(200)
    for shape in shapes[:50]:
        model.observe(shape, truth.step_time(shape))
    assert model.error is not None and model.error > 0.1  # the roofline alone is off
    for shape in shapes[50:]:
        model.observe(shape, truth.step_time(shape))
    assert model.num_fits >= 1 and model.version == model.num_fits
    probe = BatchShape.of([(512, 0), (1, 1000), (1, 2000)])
    assert model.predict(probe) == pytest.approx(truth.step_time(probe), rel=1e-6)
    recent = OnlinePerfModel(model.cost_model)
    for shape in shapes[:20]:
        recent.observe(shape, truth.step_time(shape))
    assert recent.error is not None and recent.error < 1e-6


def test_no_refit_without_enough_samples_or_while_accurate() -> None:
    truth = cost_model()
    model = OnlinePerfModel(truth, refit_every=10, min_samples=50)
    for shape in _shapes(30):
        model.observe(shape, truth.step_time(shape))
    assert model.num_fits == 0 and model.cost_model is truth
    model.observe(BatchShape(), 1.0)  # empty steps and bad durations are ignored
    model.observe(BatchShape.prefill(10), 0.0)
    assert model.num_samples == 30
    with pytest.raises(ValueError, match="refit"):
        OnlinePerfModel(truth, window=0)


def test_refit_on_a_profile_with_prefill_factors_charges_each_factor_once() -> None:
    """A calibrated profile's per-size prefill factors (andante.perf.prefill_factors) are
    charged on every prediction, so the online refit fits the linear part to the steps
    with the factor taken out: refitted on steps of that very model, it predicts them."""
    import dataclasses

    from andante.perf.cost_model import CostModel
    plain = cost_model()
    factors = (1.0,) * 6 + (1.5,) * 6  # 64 prefill tokens and up cost 1.5x the line
    hardware = dataclasses.replace(plain.hardware, prefill_factors=factors)
    truth = CostModel(plain.model, hardware)
    model = OnlinePerfModel(truth.with_coefficients(CostCoefficients(c2=1.0)),
                            refit_every=50, min_samples=20)
    for shape in _shapes(200):
        model.observe(shape, truth.step_time(shape))
    assert model.num_fits >= 1
    for probe in (BatchShape.of([(100, 0)]), BatchShape.of([(400, 0), (1, 1000)]),
                  BatchShape.of([(40, 0), (1, 500)])):
        assert model.predict(probe) == pytest.approx(truth.step_time(probe), rel=1e-6)


def test_refit_on_a_profile_with_decode_factors_charges_each_factor_once() -> None:
    """Likewise for a profile's per-batch decode factors (andante.perf.decode_factors)."""
    import dataclasses

    from andante.perf.cost_model import CostModel
    plain = cost_model()
    hardware = dataclasses.replace(plain.hardware, decode_factors=(1.3, 1.0, 0.8, 0.9))
    truth = CostModel(plain.model, hardware)
    model = OnlinePerfModel(truth.with_coefficients(CostCoefficients(c2=1.0)),
                            refit_every=50, min_samples=20)
    for shape in _shapes(200):
        model.observe(shape, truth.step_time(shape))
    assert model.num_fits >= 1
    for probe in (BatchShape.of([(1, 300)]), BatchShape.of([(1, 200)] * 5),
                  BatchShape.of([(40, 0), (1, 500)])):
        assert model.predict(probe) == pytest.approx(truth.step_time(probe), rel=1e-6)
