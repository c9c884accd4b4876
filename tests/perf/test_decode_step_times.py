"""`CostModel.decode_step_times` is `step_time` of each step of a decode run, bit for bit
(the simulator's decode runs and stepping must give identical timelines)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients

_MODELS = {(m, tp): CostModel(get_model(m), get_hardware("a100-80g"), tp=tp)
           for m, tp in [("llama-3.1-8b", 1), ("llama-3.1-70b", 4)]}
# a calibrated CPU-like profile: a KV-read term (c6) and its own set for small steps
_CALIBRATED = dataclasses.replace(
    get_hardware("a100-80g"),
    coefficients=CostCoefficients(c2=0.9, c4=1.3, c5=0.05, c6=0.4),
    serial_coefficients=CostCoefficients(c2=1.3, c4=2.0, c5=0.002, c6=1.7),
    serial_below_tokens=16)
_MODELS[("llama-3.1-8b-calibrated", 1)] = CostModel(get_model("llama-3.1-8b"), _CALIBRATED)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(_MODELS)),
       contexts=st.lists(st.integers(1, 20_000), min_size=1, max_size=40),
       num_steps=st.integers(0, 300))
def test_equals_step_time_of_each_step(key: tuple[str, int], contexts: list[int],
                                       num_steps: int) -> None:
    cost = _MODELS[key]
    shape = BatchShape.of([(1, c) for c in contexts])
    expected = []
    for _ in range(num_steps):
        expected.append(cost.step_time(shape))
        shape.advance_decodes()
    assert cost.decode_step_times(BatchShape.of([(1, c) for c in contexts]),
                                  num_steps) == expected


def test_stops_once_the_time_budget_is_reached() -> None:
    cost = _MODELS[("llama-3.1-8b", 1)]
    shape = BatchShape.decode(8, 1000)
    one = cost.step_time(shape)
    times = cost.decode_step_times(shape, 100, time_budget=2.5 * one)
    assert len(times) == 3 and sum(times[:2]) < 2.5 * one <= sum(times)
    assert cost.decode_step_times(shape, 100, time_budget=0.0) == []
    assert cost.decode_step_times(BatchShape(), 3) == [0.0, 0.0, 0.0]
