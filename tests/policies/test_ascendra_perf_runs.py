"""`OnlinePerfModel.observe_decode_run` records a decode run as `observe` step by step
would: the same samples, errors, refits and coefficients; its compact sample window
keeps what a deque of each step keeps."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients
from andante.policies.ascendra.perf import OnlinePerfModel
from andante.policies.ascendra.samples import SampleWindow

BASE = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
# the "measured" durations come from other coefficients, so the refits move the model
TRUTH = BASE.with_coefficients(CostCoefficients(0.3, 0.9, 0.05, 0.02, 0.004))


def _runs() -> list[tuple[BatchShape, list[float]]]:
    runs = []
    for batch, context, steps in [(4, 100, 7), (16, 2000, 40), (1, 50, 1), (32, 500, 90),
                                  (8, 7000, 13)]:
        shape = BatchShape.decode(batch, context)
        runs.append((shape, TRUTH.decode_step_times(shape, steps)))
    return runs


@pytest.mark.parametrize(("refit_every", "tolerance"), [(8, 0.0), (0, 0.03), (256, 0.03),
                                                        (5, 1.0)])
def test_a_run_is_observed_as_its_steps(refit_every: int, tolerance: float) -> None:
    stepped = OnlinePerfModel(BASE, window=64, refit_every=refit_every, min_samples=4,
                              error_window=32, tolerance=tolerance)
    batched = OnlinePerfModel(BASE, window=64, refit_every=refit_every, min_samples=4,
                              error_window=32, tolerance=tolerance)
    for shape, durations in _runs():
        one = shape.copy()
        for duration in durations:
            stepped.observe(one.copy(), duration)
            one.advance_decodes()
        batched.observe_decode_run(shape.copy(), durations)
        assert batched.error == stepped.error
        assert batched.num_fits == stepped.num_fits
        assert batched.cost_model.coefficients == stepped.cost_model.coefficients
        assert list(batched._samples) == list(stepped._samples)
    if refit_every == 8:
        assert stepped.num_fits > 1


def test_non_positive_durations_are_skipped_as_observe_does() -> None:
    stepped = OnlinePerfModel(BASE, refit_every=4, min_samples=2)
    batched = OnlinePerfModel(BASE, refit_every=4, min_samples=2)
    shape, durations = BatchShape.decode(4, 100), [0.01, 0.0, 0.02, -1.0, 0.03]
    one = shape.copy()
    for duration in durations:
        stepped.observe(one.copy(), duration)
        one.advance_decodes()
    batched.observe_decode_run(shape, durations)
    assert batched.num_samples == stepped.num_samples == 3
    assert batched.error == stepped.error


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=40), st.lists(st.one_of(
    st.floats(min_value=1e-3, max_value=1.0),  # one step
    st.lists(st.floats(min_value=1e-3, max_value=1.0), min_size=1, max_size=60),  # a run
), max_size=30))
def test_the_sample_window_keeps_what_a_deque_of_each_step_keeps(
        maxlen: int, parts: list[float | list[float]]) -> None:
    window, reference = SampleWindow(maxlen), deque(maxlen=maxlen)
    for index, part in enumerate(parts):
        shape = BatchShape.decode(1 + index % 5, 100 * index)
        if isinstance(part, float):
            window.append((shape, part))
            reference.append((shape, part))
            continue
        window.append_decode_run(shape, part)
        one = shape.copy()
        for duration in part:
            reference.append((one.copy(), duration))
            one.advance_decodes()
        assert len(window) == len(reference)
    assert list(window) == list(reference)
