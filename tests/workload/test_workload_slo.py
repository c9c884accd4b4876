from __future__ import annotations

import numpy as np
import pytest

from andante.workload.slo import (
    READING,
    READING_LISTENING,
    DiscreteDistribution,
    SLOConfig,
    assign_slos,
    sample_tds,
    ttft_targets,
)


def test_ttft_is_andes_max_rule() -> None:
    targets = ttft_targets(np.array([100, 5000, 12_500]))
    assert targets.tolist() == [1.0, 1.0, 2.5]
    assert ttft_targets(np.array([1000]), prefill_throughput=500, min_ttft=0.5).tolist() == [2.0]


def test_reading_distribution(rng: np.random.Generator) -> None:
    assert READING.mean == pytest.approx(4.8)
    tds = sample_tds(20_000, rng)
    assert tds.min() >= 3.3 and tds.max() <= 6.5
    assert tds.mean() == pytest.approx(4.8, rel=0.02)
    mix = sample_tds(20_000, rng, "reading-listening")
    assert set(np.unique(mix).tolist()) == {3.3, 4.8}
    assert READING_LISTENING.mean == pytest.approx((4.8 + 3.3) / 2)
    assert np.all(np.isnan(sample_tds(3, rng, "none")))


def test_assign_slos(rng: np.random.Generator) -> None:
    prompts, outputs = np.array([10, 10_000]), np.array([5, 100])
    slos = assign_slos(prompts, outputs, SLOConfig(), rng)
    assert [s.ttft for s in slos] == [1.0, 2.0]
    assert all(s.tds is not None and 3.3 <= s.tds <= 6.5 for s in slos)
    assert all(s.tbt is None and s.deadline is None for s in slos)


def test_fixed_values_and_deadlines(rng: np.random.Generator) -> None:
    config = SLOConfig(ttft=0.5, tds=10.0, tbt=0.1, deadline=2.0, deadline_per_token=0.05)
    slos = assign_slos([100, 200], [10, 40], config, rng)
    assert [(s.ttft, s.tds, s.tbt) for s in slos] == [(0.5, 10.0, 0.1)] * 2
    assert [s.deadline for s in slos] == pytest.approx([2.5, 4.0])
    slope_only = assign_slos([100], [10], SLOConfig(deadline_per_token=0.2), rng)
    assert slope_only[0].deadline == pytest.approx(2.0)
    no_tds = assign_slos([100], [10], SLOConfig(tds_distribution="none"), rng)
    assert no_tds[0].tds is None


def test_assignment_is_seeded() -> None:
    def draw(seed: int) -> list[float | None]:
        slos = assign_slos([10] * 50, [5] * 50, SLOConfig(), np.random.default_rng(seed))
        return [s.tds for s in slos]

    assert draw(3) == draw(3) and draw(3) != draw(4)


def test_invalid_slo_configs(rng: np.random.Generator) -> None:
    with pytest.raises(ValueError, match="unknown tds distribution 'fast'"):
        SLOConfig(tds_distribution="fast")
    with pytest.raises(ValueError, match="prefill_throughput"):
        SLOConfig(prefill_throughput=0.0)
    with pytest.raises(ValueError, match="tds must be a positive"):
        SLOConfig(tds=-1.0)
    with pytest.raises(ValueError, match="sum to 1"):
        DiscreteDistribution((1.0, 2.0), (0.5, 0.6))
    with pytest.raises(ValueError, match="output lengths"):
        assign_slos([1, 2], [1], SLOConfig(), rng)
