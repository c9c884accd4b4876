from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from andante.workload.arrivals import burst_rates, cyclic_burst, gamma, poisson


def _gap_cv(times: np.ndarray) -> float:
    gaps = np.diff(np.concatenate([[0.0], times]))
    return float(np.std(gaps) / np.mean(gaps))


def test_poisson_rate_and_cv(rng: np.random.Generator) -> None:
    times = poisson(8.0, 20_000, rng)
    assert len(times) == 20_000
    assert np.all(np.diff(times) >= 0) and times[0] > 0
    assert len(times) / times[-1] == pytest.approx(8.0, rel=0.03)
    assert _gap_cv(times) == pytest.approx(1.0, rel=0.05)


def test_seeded_generators_are_reproducible() -> None:
    def draw(seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [
            poisson(2.0, 100, rng),
            gamma(2.0, 3.0, 100, rng),
            cyclic_burst(2.0, 2.0, 0.35, 60.0, 100, rng),
        ]

    for first, second in zip(draw(7), draw(7), strict=True):
        np.testing.assert_array_equal(first, second)
    assert not np.array_equal(draw(7)[0], draw(8)[0])


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_rate_and_cv(cv: float, rng: np.random.Generator) -> None:
    times = gamma(5.0, cv, 20_000, rng)
    assert len(times) / times[-1] == pytest.approx(5.0, rel=0.08)
    assert _gap_cv(times) == pytest.approx(cv, rel=0.1)


def test_duration_bound(rng: np.random.Generator) -> None:
    times = poisson(10.0, None, rng, duration=100.0)
    assert times[-1] <= 100.0 and len(times) == pytest.approx(1000, rel=0.1)
    capped = gamma(10.0, 2.0, 50, rng, duration=100.0)
    assert len(capped) == 50  # the count bound comes first
    short = poisson(10.0, 10_000, rng, duration=5.0)
    assert short[-1] <= 5.0 and len(short) < 100  # the duration bound comes first
    assert len(poisson(1.0, None, rng, duration=0.0)) == 0


def test_burst_rates_follow_andes_definition() -> None:
    burst, base = burst_rates(10.0, 2.0, 0.35)
    assert burst == pytest.approx(20.0)  # intensity is relative to the whole trace's rate
    assert 0.35 * burst + 0.65 * base == pytest.approx(10.0)  # the cycle's mean is `rate`
    assert burst_rates(3.0, 1.0, 0.5) == pytest.approx((3.0, 3.0))
    assert burst_rates(3.0, 2.0, 0.5) == pytest.approx((6.0, 0.0))


def test_burst_phases_have_intended_rates(rng: np.random.Generator) -> None:
    rate, intensity, share, cycle = 10.0, 2.0, 0.35, 100.0
    times = cyclic_burst(rate, intensity, share, cycle, None, rng, duration=100 * cycle)
    assert np.all(np.diff(times) >= 0) and times[-1] <= 100 * cycle
    in_burst = np.mod(times, cycle) < share * cycle
    burst_rate = np.count_nonzero(in_burst) / (100 * share * cycle)
    base_rate = np.count_nonzero(~in_burst) / (100 * (1 - share) * cycle)
    expected_burst, expected_base = burst_rates(rate, intensity, share)
    assert burst_rate == pytest.approx(expected_burst, rel=0.03)
    assert base_rate == pytest.approx(expected_base, rel=0.05)
    assert burst_rate / base_rate == pytest.approx(
        intensity * (1 - share) / (1 - intensity * share), rel=0.06
    )
    assert len(times) / (100 * cycle) == pytest.approx(rate, rel=0.03)


def test_burst_count_bound_and_degenerate_shares(rng: np.random.Generator) -> None:
    times = cyclic_burst(4.0, 2.0, 0.35, 50.0, 5000, rng)
    assert len(times) == 5000 and np.all(np.diff(times) >= 0)
    flat = cyclic_burst(4.0, 3.0, 0.0, 50.0, 20_000, rng)  # no burst: plain Poisson
    assert len(flat) / flat[-1] == pytest.approx(4.0, rel=0.03)
    only_burst = cyclic_burst(4.0, 2.0, 0.5, 10.0, None, rng, duration=1000.0)
    assert np.all(np.mod(only_burst, 10.0) <= 5.0 + 1e-9)  # nothing outside the bursts


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: poisson(0.0, 10, r), "rate"),
        (lambda r: poisson(1.0, None, r), "num or duration"),
        (lambda r: poisson(1.0, -1, r), "num"),
        (lambda r: gamma(1.0, 0.0, 10, r), "cv"),
        (lambda r: cyclic_burst(1.0, 3.0, 0.5, 10.0, 10, r), "burst_intensity × burst_share"),
        (lambda r: cyclic_burst(1.0, 0.5, 0.5, 10.0, 10, r), "burst_intensity"),
        (lambda r: cyclic_burst(1.0, 2.0, 1.5, 10.0, 10, r), "burst_share"),
        (lambda r: cyclic_burst(1.0, 2.0, 0.3, 0.0, 10, r), "cycle_length"),
    ],
)
def test_invalid_arguments(
    call: Callable[[np.random.Generator], object], message: str, rng: np.random.Generator
) -> None:
    with pytest.raises(ValueError, match=message):
        call(rng)
