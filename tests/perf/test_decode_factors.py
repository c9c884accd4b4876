"""andante.perf.decode_factors: a decode step time that bends with the batch size, fitted
from a step log into HardwareSpec.decode_factors, charged by the cost model (and so by the
simulator), absent from every profile that does not fit one."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.exec.torch_cost import cpu_hardware
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.decode_factors import decode_batch
from andante.perf.log_fit import fit_step_log
from andante.perf.prefill_factors import fit_class_factors
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients, HardwareSpec
from andante.perf.step_log import parse_steps, step_record

SMOL = get_model("smollm2-135m")
CPU = cpu_hardware()[0]
LINEAR = dataclasses.replace(CPU, coefficients=CostCoefficients(c2=0.0, c3=0.565, c4=0.266,
                                                                c5=0.0128))
# one decode 15% cheaper than the line through the others, 16-31 decodes 15% dearer
BENT = (0.85, 1.0, 1.0, 1.0, 1.15)
A100 = get_hardware("a100-80g")


def _calibration_log(truth: CostModel, noise: float, seed: int = 0) -> list[str]:
    """A served calibration load's log: prompts of 16-511 tokens beside 0-6 decodes, and
    decode steps of every batch up to 31 (most of them large: a loaded engine), contexts
    of 20-600 tokens, timed by `truth` (x 1 +- noise)."""
    rng = random.Random(seed)
    chunks: list[list[tuple[int, int]]] = []
    for _ in range(120):
        chunks.append([(rng.randrange(16, 512), 0)]
                      + [(1, rng.randrange(20, 600))] * rng.randint(0, 6))
        chunks += [[(1, rng.randrange(20, 600))] * rng.choice((1, 2, 3, 5, 9, 12, 20, 28))
                   for _ in range(4)]
    lines = []
    for chunk in chunks:
        shape = BatchShape.of(chunk)
        duration = truth.step_time(shape) * rng.uniform(1 - noise, 1 + noise)
        lines.append(json.dumps(step_record(shape, duration, sum(c for _, c in chunk))))
    return lines


def _fit(truth: CostModel, noise: float, seed: int = 0) -> HardwareSpec:
    return fit_step_log(parse_steps(_calibration_log(truth, noise, seed)), SMOL, CPU,
                        "mine").hardware


@pytest.mark.parametrize("seed", [0, 1])
def test_a_log_of_bent_decode_costs_predicts_small_batches_with_its_factors(seed):
    """The measured runs' decode steps are of 1-3 sequences at short contexts: the linear
    fit of a loaded calibration misses them, the fit with batch factors does not."""
    truth = CostModel(SMOL, dataclasses.replace(LINEAR, decode_factors=BENT))
    fitted = _fit(truth, noise=0.05, seed=seed)
    assert fitted.decode_factors and fitted.decode_factors[0] < 0.95
    bent, linear = CostModel(SMOL, fitted), CostModel(
        SMOL, dataclasses.replace(fitted, decode_factors=()))
    worst_linear = 0.0
    for batch in (1, 2, 3):
        for context in (40, 150, 300):
            shape = BatchShape.of([(1, context)] * batch)
            assert bent.step_time(shape) == pytest.approx(truth.step_time(shape), rel=0.04)
            worst_linear = max(worst_linear,
                               abs(linear.step_time(shape) / truth.step_time(shape) - 1))
    assert worst_linear > 0.08  # the same coefficients without the factors miss


def test_a_linear_log_gets_no_decode_factors():
    assert _fit(CostModel(SMOL, LINEAR), noise=0.05).decode_factors == ()
    assert _fit(CostModel(SMOL, LINEAR), noise=0.0).decode_factors == ()


def test_only_decode_steps_count_toward_the_decode_factors():
    steps = parse_steps(_calibration_log(CostModel(SMOL, LINEAR), noise=0.0))
    plain = CostModel(SMOL, LINEAR).step_time
    slower_prefills = [dataclasses.replace(s, duration=s.duration * 1.5)
                       if decode_batch(s.shape) == 0 else s for s in steps]
    assert fit_class_factors(slower_prefills, plain, decode_batch) == ()
    slower_ones = [dataclasses.replace(s, duration=s.duration * 1.3)
                   if decode_batch(s.shape) == 1 else s for s in steps]
    assert fit_class_factors(slower_ones, plain, decode_batch) == (pytest.approx(1.3),)


shapes = st.builds(
    lambda prompt, cached, decodes, context: BatchShape.of(
        ([(prompt, cached)] if prompt else []) + [(1, context)] * decodes),
    st.integers(0, 2000), st.integers(0, 500), st.integers(0, 40), st.integers(1, 1000),
).filter(lambda s: s.num_tokens > 0)


@settings(max_examples=200, deadline=None)
@given(shapes, st.lists(st.floats(0.5, 2.0), max_size=8),
       st.lists(st.floats(0.5, 2.0), max_size=8))
def test_decode_steps_pay_their_batch_factor_and_others_their_prefill_factor(
        shape, decode, prefill):
    plain = CostModel(SMOL, A100)
    bent = CostModel(SMOL, dataclasses.replace(A100, decode_factors=tuple(decode),
                                               prefill_factors=tuple(prefill)))
    if shape.num_decode_seqs == shape.num_seqs:
        index, factors = shape.num_decode_seqs.bit_length() - 1, decode
    else:
        index, factors = (shape.num_tokens - shape.num_decode_seqs).bit_length() - 1, prefill
    factor = factors[index] if index < len(factors) else 1.0
    assert bent.step_time(shape) == pytest.approx(plain.step_time(shape) * factor, rel=1e-12)
    assert bent.size_factor(shape) == factor
    run = bent.decode_step_times(shape, 3)  # the simulator's runs charge it alike
    assert run[0] == bent.step_time(shape)
    after = shape.copy()
    after.advance_decodes()
    assert run[1] == bent.step_time(after)


def test_calibrate_reports_and_saves_the_decode_factors(tmp_path, monkeypatch, capsys):
    from andante.cli.main import main
    from andante.perf.paths import ANDANTE_HOME_ENV

    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    truth = CostModel(SMOL, dataclasses.replace(LINEAR, decode_factors=BENT))
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join(_calibration_log(truth, noise=0.05)) + "\n", encoding="utf-8")
    argv = ["calibrate", "--step-log", str(log), "--model", "smollm2-135m",
            "--base-hardware", "cpu", "--name", "bent"]
    assert main(argv) == 0
    assert "decode batch factors: 1 decode x0." in capsys.readouterr().out
    saved = get_hardware("bent")
    assert saved.decode_factors and saved.decode_factors[0] < 0.95
    assert main([*argv, "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_factors"] == list(saved.decode_factors)
