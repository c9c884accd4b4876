"""A profile's launch floor (`eager_launch_per_layer`): steps with prefill tokens that an
engine launches op by op take at least the host's launching time; decodes do not."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.specs import HardwareSpec

LLAMA = get_model("llama-3.1-8b")
TORCH = CostModel(LLAMA, get_hardware("h200-torch"))
SERVING = CostModel(LLAMA, get_hardware("h200"))
FLOOR = get_hardware("h200-torch").eager_launch_per_layer * LLAMA.num_layers


def test_short_prefills_and_mixed_steps_sit_on_the_floor_decodes_do_not():
    assert pytest.approx(25.1e-3, rel=0.01) == FLOOR
    for shape in (BatchShape.prefill(128), BatchShape.prefill(512),
                  BatchShape.of([(64, 0), (1, 500), (1, 700)])):
        assert SERVING.step_time(shape) < FLOOR
        assert TORCH.step_time(shape) == FLOOR
    for shape in (BatchShape.decode(1, 1024), BatchShape.decode(256, 1024)):
        assert TORCH.step_time(shape) == SERVING.step_time(shape)
    long = BatchShape.prefill(4096)  # the GPU work is longer than the launching
    assert TORCH.step_time(long) == SERVING.step_time(long) > FLOOR


def test_the_floor_grows_with_the_layers():
    big = get_model("llama-3.1-70b")
    model = CostModel(big, get_hardware("h200-torch"), tp=4)
    assert model.step_time(BatchShape.prefill(16)) == pytest.approx(
        FLOOR * big.num_layers / LLAMA.num_layers)


@settings(max_examples=40, deadline=None)
@given(contexts=st.lists(st.integers(0, 5000), min_size=1, max_size=20),
       num_steps=st.integers(0, 50))
def test_decode_runs_take_the_floor_exactly_as_single_steps(contexts, num_steps):
    shape = BatchShape.of([(1, c) for c in contexts])
    expected = []
    for _ in range(num_steps):
        expected.append(TORCH.step_time(shape))
        shape.advance_decodes()
    assert TORCH.decode_step_times(BatchShape.of([(1, c) for c in contexts]),
                                   num_steps) == expected


def test_profile_json_keeps_the_floor_and_provenance():
    spec = dataclasses.replace(get_hardware("h200-torch"), name="mine",
                               fitted_on="step log x.jsonl (vllm): 40 steps")
    assert HardwareSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="eager_launch_per_layer"):
        dataclasses.replace(spec, eager_launch_per_layer=-1e-3)
