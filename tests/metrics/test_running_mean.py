"""`RunningMean`: the one online mean (Ascendra's decode lengths, the cluster's expected
output length)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from andante.metrics import RunningMean


def test_the_default_stands_until_the_first_value() -> None:
    mean = RunningMean(default=256.0)
    assert mean.mean == 256.0 and mean.count == 0
    mean.observe(10)
    assert mean.mean == 10.0 and mean.count == 1


@given(st.lists(st.integers(0, 100_000), min_size=1, max_size=200))
def test_it_is_the_mean_of_what_it_saw(values: list[int]) -> None:
    mean = RunningMean()
    for value in values:
        mean.observe(value)
    assert mean.count == len(values)
    assert math.isclose(mean.mean, sum(values) / len(values), rel_tol=1e-12)
