"""andante.perf.idle_wake and the step log's idle gaps: the extra cost of a step after
the engine sat idle, fitted from a log with end times, recovered from a synthetic log
with a known penalty, and 0 (saying why) where the log cannot show one."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.idle_wake import MIN_IDLE_GAP, fit_idle_wake
from andante.perf.log_fit import fit_step_log
from andante.perf.shape import BatchShape
from andante.perf.step_log import parse_steps, step_record

LLAMA = get_model("llama-3.1-8b")
A100 = get_hardware("a100-80g")
MODEL = CostModel(LLAMA, A100)
DECODE = BatchShape.of([(1, 300)] * 4)


def _prompt(tokens: int) -> BatchShape:
    return BatchShape.of([(tokens, 0)])


def _log(gaps: list[float], penalty: float, after: float, noise: float = 0.0,
         seed: int = 0, decodes: int = 6, **extra: Any) -> list[str]:
    """A served log: per gap, a prompt after that many idle seconds (paying `penalty`
    from `after` on), then `decodes` decode steps back to back; durations as MODEL
    times them (x 1 +- noise), `t` the end of each step."""
    rng, t, lines = random.Random(seed), 0.0, []
    for index, gap in enumerate(gaps):
        decode = BatchShape.of([(1, 300)] * (1 + index % 4))
        shapes = [_prompt(32 + 64 * (index % 7))] + [decode] * decodes
        for number, shape in enumerate(shapes):
            idle = gap if number == 0 else 0.0
            cost = MODEL.step_time(shape) * rng.uniform(1 - noise, 1 + noise)
            cost += penalty if number == 0 and idle >= after else 0.0
            t += idle + cost
            lines.append(json.dumps(step_record(shape, cost, 0, t=t, **extra)))
    return lines


GAPS = [0.05, 0.2, 0.4, 0.6, 0.8, 1.2, 1.5, 2.0, 3.0, 4.5, 0.3, 2.5, 6.0, 0.1, 1.8]


def test_the_step_log_reads_each_steps_idle_gap_from_its_end_times():
    lines = [json.dumps(step_record(DECODE, 0.010, 0, t=t)) for t in (1.0, 1.010, 1.5)]
    lines.append(json.dumps(step_record(DECODE, 0.020, 0, t=1.52, overhead=0.002)))
    lines.append(json.dumps(step_record(DECODE, 0.010, 0, t=0.3)))  # another process
    lines.append(json.dumps(step_record(DECODE, 0.010, 0)))  # no end time
    gaps = [s.idle_before for s in parse_steps(lines)]
    assert gaps[0] is None and gaps[1] == pytest.approx(0.0, abs=1e-12)
    assert gaps[2] == pytest.approx(0.48) and gaps[3] == pytest.approx(0.0, abs=1e-12)
    assert gaps[4] is None and gaps[5] is None


@settings(max_examples=20, deadline=None)
@given(penalty=st.floats(0.005, 0.05), after=st.sampled_from([0.25, 0.7, 1.0, 1.6]))
def test_a_known_penalty_and_its_threshold_are_recovered(penalty: float, after: float):
    steps = parse_steps(_log(GAPS, penalty, after))
    wake = fit_idle_wake(steps, MODEL.step_time)
    assert wake.penalty == pytest.approx(penalty, rel=1e-6)
    below = max(g for g in GAPS if g < after)
    first = min(g for g in GAPS if g >= after)
    assert below < wake.after <= first
    assert wake.num_woken == sum(g >= after for g in GAPS) and wake.note is None
    assert wake.num_idle_steps == sum(g >= MIN_IDLE_GAP for g in GAPS[1:])


def test_noise_leaves_the_penalty_close():
    steps = parse_steps(_log(GAPS * 3, 0.020, 1.0, noise=0.03, seed=7))
    wake = fit_idle_wake(steps, MODEL.step_time)
    assert wake.penalty == pytest.approx(0.020, abs=0.006)
    assert 0.6 < wake.after <= 1.2


def test_a_log_without_idle_gaps_fits_no_wake_and_says_so():
    steps = parse_steps(_log([0.0] * 12, 0.0, 1.0))
    wake = fit_idle_wake(steps, MODEL.step_time)
    assert (wake.penalty, wake.after, wake.num_idle_steps) == (0.0, 0.0, 0)
    assert wake.note is not None and "only 0 steps followed an idle gap" in wake.note


def test_idle_steps_no_slower_than_the_fit_give_no_wake():
    steps = parse_steps(_log(GAPS * 2, 0.0, 1.0, noise=0.05, seed=3))
    wake = fit_idle_wake(steps, MODEL.step_time)
    assert wake.penalty == 0.0 and wake.note is not None and "no slower" in wake.note


def test_a_log_without_end_times_fits_no_wake_and_says_so():
    lines = [json.dumps({k: v for k, v in json.loads(line).items() if k != "t"})
             for line in _log(GAPS, 0.020, 1.0)]
    wake = fit_idle_wake(parse_steps(lines), MODEL.step_time)
    assert wake.penalty == 0.0 and wake.note is not None and "no end times" in wake.note


def test_the_log_fit_saves_the_wake_in_the_profile():
    fit = fit_step_log(parse_steps(_log(GAPS * 2, 0.015, 1.0, engine="vllm")), LLAMA,
                       A100, "woken")
    assert fit.idle_wake is not None
    assert fit.hardware.idle_wake == pytest.approx(0.015, rel=0.05)
    assert 0.8 < fit.hardware.idle_wake_after <= 1.2
    assert fit.error < 0.01  # the coefficients still fit the steps' shapes



def test_a_few_slow_steps_after_idle_on_a_busy_machine_make_no_wake():
    """Stalls, not a wake: three of the prompts after 1 s idle or more 0.3 s slower,
    the other five as predicted."""
    lines = _log(GAPS, 0.0, 1.0, decodes=6)
    slow = {7 * i for i in (5, 8, 12)}  # the prompt lines after gaps of 1.2, 3 and 6 s
    lines = [json.dumps({**json.loads(line), "duration": json.loads(line)["duration"] + 0.3})
             if number in slow else line for number, line in enumerate(lines)]
    wake = fit_idle_wake(parse_steps(lines), MODEL.step_time)
    assert wake.penalty == 0.0 and wake.note is not None
