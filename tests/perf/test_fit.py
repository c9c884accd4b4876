import random

import pytest

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.fit import features, fit_coefficients, prediction_error
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients


def _random_shapes(seed: int, count: int) -> list[BatchShape]:
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        num_decodes = rng.randint(0, 128)
        chunks = [(1, rng.randint(16, 4096)) for _ in range(num_decodes)]
        if rng.random() < 0.6 or not chunks:
            chunks.append((rng.randint(16, 4096), rng.choice([0, 0, 512])))
        shapes.append(BatchShape.of(chunks))
    return shapes


@pytest.fixture
def base_model() -> CostModel:
    return CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


def test_fit_recovers_known_coefficients(base_model):
    truth = CostCoefficients(c1=0.0, c2=1.1, c3=0.3, c4=0.7, c5=2e-3)
    true_model = base_model.with_coefficients(truth)
    samples = [(s, true_model.step_time(s)) for s in _random_shapes(0, 300)]
    fitted = fit_coefficients(base_model, samples)
    assert fitted.as_tuple() == pytest.approx(truth.as_tuple(), rel=1e-6, abs=1e-9)
    assert prediction_error(base_model.with_coefficients(fitted), samples) < 1e-9


def test_c1_is_folded_into_c3_and_c4(base_model):
    # tM+tF is the sum of two other features: only c1+c3 and c1+c4 are identifiable.
    truth = CostCoefficients(c1=0.2, c2=0.9, c3=0.1, c4=0.5, c5=1e-3)
    true_model = base_model.with_coefficients(truth)
    samples = [(s, true_model.step_time(s)) for s in _random_shapes(1, 200)]
    fitted = fit_coefficients(base_model, samples, relative=False)
    assert fitted.c1 == 0.0
    assert fitted.c2 == pytest.approx(0.9, rel=1e-6)
    assert fitted.c3 == pytest.approx(0.3, rel=1e-6)
    assert fitted.c4 == pytest.approx(0.7, rel=1e-6)
    assert fitted.c5 == pytest.approx(1e-3, rel=1e-6)


def test_fit_is_non_negative_and_robust_to_noise(base_model):
    truth = CostCoefficients(c2=1.0, c3=0.25, c4=1.0, c5=1.1e-3)
    true_model = base_model.with_coefficients(truth)
    rng = random.Random(7)
    samples = [(s, true_model.step_time(s) * rng.uniform(0.95, 1.05))
               for s in _random_shapes(2, 400)]
    fitted = fit_coefficients(base_model, samples)
    assert min(fitted.as_tuple()) >= 0.0
    assert prediction_error(base_model.with_coefficients(fitted), samples) < 0.04


def test_fit_clamps_a_negative_optimum_to_zero(base_model):
    # Durations that shrink with size would need negative coefficients.
    shapes = [BatchShape.decode(b, 512) for b in (1, 4, 16, 64)]
    samples = [(s, 0.05 - 0.0001 * s.num_tokens) for s in shapes]
    fitted = fit_coefficients(base_model, samples)
    assert min(fitted.as_tuple()) >= 0.0
    assert fitted.c5 > 0.0


def test_fit_subtracts_tensor_parallel_communication():
    model = CostModel(get_model("llama-3.1-70b"), get_hardware("h100-80g"), tp=4)
    truth = CostCoefficients(c2=1.0, c3=0.2, c4=0.6, c5=1.5e-3)
    true_model = model.with_coefficients(truth)
    samples = [(s, true_model.step_time(s)) for s in _random_shapes(3, 150)]
    fitted = fit_coefficients(model, samples)
    assert fitted.as_tuple() == pytest.approx(truth.as_tuple(), rel=1e-6, abs=1e-9)


def test_features_follow_ascendra(base_model):
    shape = BatchShape.decode(8, 1000)
    t_sum, t_max, t_m, t_f, one = features(base_model, shape)
    assert (t_m, t_f) == base_model.terms(shape)
    assert t_sum == t_m + t_f and t_max == max(t_m, t_f) and one == 1.0


def test_invalid_samples_are_rejected(base_model):
    with pytest.raises(ValueError, match="at least one"):
        fit_coefficients(base_model, [])
    with pytest.raises(ValueError, match="sample 0 is an empty step"):
        fit_coefficients(base_model, [(BatchShape(), 0.01)])
    with pytest.raises(ValueError, match="invalid duration -1"):
        prediction_error(base_model, [(BatchShape.decode(1, 10), -1.0)])
