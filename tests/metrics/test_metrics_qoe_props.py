"""Property tests of QoE: bounds, monotonicity under delay, agreement with references."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.metrics import qoe
from tests.metrics.reference import brute_qoe_at, consumption, paper_qoe

gaps = st.lists(st.floats(0.0, 3.0), min_size=0, max_size=120)
tds_st = st.floats(0.5, 10.0)
target_st = st.floats(0.0, 3.0)
arrival_st = st.floats(0.0, 100.0)


def stream(arrival: float, first: float, steps: list[float]) -> list[float]:
    times = [arrival + first]
    for g in steps:
        times.append(times[-1] + g)
    return times


@settings(max_examples=300, deadline=None)
@given(arrival_st, st.floats(0.0, 10.0), gaps, target_st, tds_st, st.floats(0.0, 200.0))
def test_bounded(
    arrival: float, first: float, steps: list[float], target: float, tds: float, dt: float
) -> None:
    times = stream(arrival, first, steps)
    assert 0.0 <= qoe(arrival, times, target, tds) <= 1.0
    assert 0.0 <= qoe(arrival, times, target, tds, now=arrival + dt) <= 1.0


@settings(max_examples=300, deadline=None)
@given(
    arrival_st,
    st.floats(0.0, 10.0),
    gaps,
    target_st,
    tds_st,
    st.floats(0.0, 200.0),
    st.data(),
)
def test_delaying_a_token_never_raises_qoe_at_a_fixed_time(
    arrival: float,
    first: float,
    steps: list[float],
    target: float,
    tds: float,
    dt: float,
    data: st.DataObject,
) -> None:
    times = stream(arrival, first, steps)
    j = data.draw(st.integers(0, len(times) - 1))
    delta = data.draw(st.floats(0.0, 20.0))
    delayed = times[:j] + [max(t, times[j] + delta) for t in times[j:]]
    now = arrival + dt
    before = qoe(arrival, times, target, tds, now=now)
    after = qoe(arrival, delayed, target, tds, now=now)
    assert after <= before + 1e-9


@settings(max_examples=300, deadline=None)
@given(arrival_st, st.floats(0.0, 10.0), gaps, target_st, tds_st)
def test_final_value_is_eq_1_to_3(
    arrival: float, first: float, steps: list[float], target: float, tds: float
) -> None:
    times = stream(arrival, first, steps)
    expected = paper_qoe(arrival, times, target, tds)
    assert math.isclose(qoe(arrival, times, target, tds), expected, abs_tol=1e-9)
    # the mid-flight generalization at t = T_n^actual reduces to it exactly
    last = consumption(times, tds)[-1]
    at_end = brute_qoe_at(arrival, times, target, tds, last, len(times))
    assert math.isclose(at_end, expected, abs_tol=1e-9)
    assert math.isclose(
        qoe(arrival, times, target, tds, now=last, max_tokens=len(times)), expected, abs_tol=1e-9
    )


@settings(max_examples=300, deadline=None)
@given(
    arrival_st,
    st.floats(0.0, 10.0),
    gaps,
    target_st,
    tds_st,
    st.floats(0.0, 100.0),
    st.integers(0, 50),
)
def test_midflight_matches_brute_force(
    arrival: float,
    first: float,
    steps: list[float],
    target: float,
    tds: float,
    dt: float,
    extra: int,
) -> None:
    times = stream(arrival, first, steps)
    now = arrival + dt
    max_tokens = len(times) + extra
    ours = qoe(arrival, times, target, tds, now=now, max_tokens=max_tokens)
    if extra == 0 and now >= consumption(times, tds)[-1]:
        now = consumption(times, tds)[-1]  # all consumed: the value freezes
    ref = brute_qoe_at(arrival, times, target, tds, now, max_tokens)
    assert math.isclose(ours, ref, abs_tol=1e-9)


@settings(max_examples=200, deadline=None)
@given(arrival_st, st.floats(0.0, 10.0), gaps, target_st, tds_st, st.floats(0.0, 100.0))
def test_midflight_unbounded_matches_brute_force(
    arrival: float, first: float, steps: list[float], target: float, tds: float, dt: float
) -> None:
    times = stream(arrival, first, steps)
    now = arrival + dt
    ours = qoe(arrival, times, target, tds, now=now)
    ref = brute_qoe_at(arrival, times, target, tds, now, len(times) + 2000)  # > any due count
    assert math.isclose(ours, ref, abs_tol=1e-9)
