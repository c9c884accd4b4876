"""andante.perf.log_fit: a profile from a step log, or a refusal naming what is missing."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.log_fit import (
    MIN_WORK_CORRELATION,
    LogFitRefused,
    _rank_correlation,
    check_log,
    fit_step_log,
)
from andante.perf.specs import CostCoefficients
from andante.perf.step_log import parse_steps
from tests.perf.steplogs import CHUNKS, logged_steps

LLAMA = get_model("llama-3.1-8b")
A100 = get_hardware("a100-80g")


def _steps(records):
    return parse_steps(json.dumps(r) for r in records)


coefficients = st.builds(
    CostCoefficients, c2=st.floats(0.5, 2.0), c3=st.floats(0.0, 1.0),
    c4=st.floats(0.0, 2.0), c5=st.floats(1e-4, 1e-2), c6=st.floats(0.0, 1.0))


@settings(max_examples=25, deadline=None)
@given(coefficients)
def test_the_fit_predicts_the_steps_of_the_profile_that_timed_them(truth):
    timed = CostModel(LLAMA, A100.with_coefficients(truth))
    fit = fit_step_log(_steps(logged_steps(timed, engine="vllm")), LLAMA, A100, "mine")
    fitted = CostModel(LLAMA, fit.hardware)
    assert fit.error < 1e-6 and fit.engines == ["vllm"] and fit.num_on_floor == 0
    for shape in (s.shape for s in _steps(logged_steps(timed))):
        assert fitted.step_time(shape) == pytest.approx(timed.step_time(shape), rel=1e-6)
    assert fit.hardware.peak_flops == A100.peak_flops  # the base's rates are kept
    assert "vllm" in (fit.hardware.fitted_on or "") and "prefill tokens per step 32-" \
        in (fit.hardware.fitted_on or "")


def test_noise_gives_a_fit_error_of_its_size():
    timed = CostModel(LLAMA, A100)
    rng = random.Random(3)
    records = [dict(r, duration=r["duration"] * rng.uniform(0.95, 1.05))
               for r in logged_steps(timed) * 3]
    fit = fit_step_log(_steps(records), LLAMA, A100, "noisy")
    assert 0.005 < fit.error < 0.05
    assert set(fit.by_kind) == {"decode", "prefill", "mixed"}
    assert all(0.95 < k.ratio < 1.05 for k in fit.by_kind.values())


def test_a_launch_floor_is_fitted_only_where_the_log_marks_steps_op_by_op():
    timed = CostModel(LLAMA, dataclasses.replace(A100, eager_launch_per_layer=1e-3))
    assert timed.step_time(CHUNKS_SHAPE_32) == pytest.approx(32e-3)  # on the floor
    records = [dict(r, graph=r["num_prefill_tokens"] == 0) for r in logged_steps(timed)]
    fit = fit_step_log(_steps(records), LLAMA, A100, "eager")
    assert fit.num_on_floor >= 2 and fit.error < 1e-6
    assert fit.hardware.eager_launch_per_layer == pytest.approx(1e-3)
    unmarked = fit_step_log(_steps(logged_steps(timed)), LLAMA, A100, "unmarked")
    assert unmarked.num_on_floor == 0 and unmarked.hardware.eager_launch_per_layer == 0


CHUNKS_SHAPE_32 = _steps(logged_steps(CostModel(LLAMA, A100), CHUNKS[:1]))[0].shape


def _refusal(records) -> str:
    with pytest.raises(LogFitRefused) as info:
        check_log(_steps(records), CostModel(LLAMA, A100))
    return str(info.value)


def test_a_log_without_steps_is_refused():
    assert "no step records" in _refusal([])


def test_a_log_of_one_kind_is_refused_naming_the_missing_kind():
    timed = CostModel(LLAMA, A100)
    decodes = [r for r in logged_steps(timed) if r["num_prefill_tokens"] == 0]
    assert "no prefill steps" in _refusal(decodes)
    prefills = [r for r in logged_steps(timed) if r["num_decode_seqs"] == 0]
    assert "no decode steps" in _refusal(prefills)


def test_a_log_of_few_shapes_is_refused_however_long():
    # one request: its prompt, then 200 decode steps of one sequence, context growing
    timed = CostModel(LLAMA, A100)
    steps = logged_steps(timed, (((300, 0),), ((100, 0),)))
    steps += logged_steps(timed, [((1, 300 + i),) for i in range(200)])
    assert "only 3 distinct step shapes" in _refusal(steps)


def test_a_kind_with_one_shape_is_refused():
    timed = CostModel(LLAMA, A100)
    chunks = [c for c in CHUNKS if all(n == 1 for n, _ in c)] + [((64, 0),)] * 2
    assert "prefill steps have only 1 distinct shape" in _refusal(logged_steps(timed, chunks))


def test_durations_that_do_not_grow_with_work_are_refused():
    timed = CostModel(LLAMA, A100)
    records = logged_steps(timed)
    durations = sorted((r["duration"] for r in records), reverse=True)
    by_work = sorted(records, key=lambda r: r["duration"])
    reversed_records = [dict(r, duration=d) for r, d in zip(by_work, durations, strict=True)]
    message = _refusal(reversed_records)
    assert "do not increase with the steps' work" in message and LLAMA.name in message


def _served_like_log(seed: int) -> list[dict]:
    """A served small model's log: mostly decode steps of 1-12 sequences whose work
    differs by a few percent, each timed with +-15% noise (a shared CPU), and a few
    prompts of varied length."""
    timed = CostModel(get_model("smollm2-135m"), A100)
    rng = random.Random(seed)
    chunks = [((n, 0),) for n in (24, 60, 100, 150, 230, 300, 420, 500)]
    chunks += [((1, rng.randrange(20, 400)),) * rng.randint(1, 12) for _ in range(600)]
    return [dict(r, duration=r["duration"] * rng.uniform(0.85, 1.15))
            for r in logged_steps(timed, chunks)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_small_models_noisy_short_decodes_pass_and_shuffled_durations_do_not(seed):
    records = _served_like_log(seed)
    steps = _steps(records)
    model = CostModel(get_model("smollm2-135m"), A100)
    per_step = _rank_correlation([sum(model.terms(s.shape)) for s in steps],
                                 [s.duration for s in steps])
    assert per_step < MIN_WORK_CORRELATION  # what refused a valid vLLM CPU log
    check_log(steps, model)  # per shape: accepted
    durations = [r["duration"] for r in records]
    random.Random(seed + 10).shuffle(durations)
    shuffled = [dict(r, duration=d) for r, d in zip(records, durations, strict=True)]
    with pytest.raises(LogFitRefused, match="do not increase with the steps' work"):
        check_log(_steps(shuffled), model)


def test_a_few_stalled_steps_are_left_out_and_counted_many_are_refused():
    timed = CostModel(LLAMA, A100)
    records = logged_steps(timed) * 5  # 60 steps
    stalled = [dict(r, duration=r["duration"] * 50) if i in (3, 40) else r
               for i, r in enumerate(records)]
    fit = fit_step_log(_steps(stalled), LLAMA, A100, "stalls")
    assert fit.num_stalled == 2 and fit.num_steps == 58 and fit.error < 1e-6
    assert "2 stalled steps left out" in (fit.hardware.fitted_on or "")
    busy = [dict(r, duration=r["duration"] * 50) if i % 10 == 0 else r
            for i, r in enumerate(records)]
    with pytest.raises(LogFitRefused, match="6 of 60 steps took more than 4x"):
        fit_step_log(_steps(busy), LLAMA, A100, "busy")
