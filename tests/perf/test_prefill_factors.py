"""andante.perf.prefill_factors: a step time that bends with the prefill size, fitted from
a step log into HardwareSpec.prefill_factors, charged by the cost model (and so by the
simulator), absent from every profile that does not fit one."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cli.calibrate_log import factors_text
from andante.cli.main import main
from andante.exec.torch_cost import cpu_hardware
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.log_fit import fit_step_log
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.prefill_factors import fit_class_factors, prefill_tokens, size_class
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients, HardwareSpec
from andante.perf.step_log import LoggedStep, parse_steps, step_record

SMOL = get_model("smollm2-135m")
CPU = cpu_hardware()[0]
# a fit of a quiet vLLM CPU log (issue 31), linear part
LINEAR = dataclasses.replace(CPU, coefficients=CostCoefficients(c2=0.0, c3=0.565, c4=0.266,
                                                                c5=0.0128))
BENT = (1.0,) * 6 + (1.3, 1.0, 0.9)  # 64-127 prefill tokens 30% dearer, 256-511 10% less
A100 = get_hardware("a100-80g")


def _log(truth: CostModel, noise: float, seed: int = 0) -> list[str]:
    """A served log: prompts of 16-511 tokens alone and beside 1-6 decodes, and decode
    steps, timed by `truth` (x 1 +- noise)."""
    rng = random.Random(seed)
    chunks: list[list[tuple[int, int]]] = []
    for _ in range(160):
        prompt = [(rng.randrange(16, 512), 0)]
        decodes = [(1, rng.randrange(20, 400))] * rng.randint(0, 6)
        chunks.append(prompt + decodes)
        chunks += [[(1, rng.randrange(20, 400))] * rng.randint(1, 8) for _ in range(3)]
    lines = []
    for chunk in chunks:
        shape = BatchShape.of(chunk)
        duration = truth.step_time(shape) * rng.uniform(1 - noise, 1 + noise)
        lines.append(json.dumps(step_record(shape, duration, sum(c for _, c in chunk))))
    return lines


def _fit(truth: CostModel, noise: float, seed: int = 0) -> HardwareSpec:
    return fit_step_log(parse_steps(_log(truth, noise, seed)), SMOL, CPU, "mine").hardware


@pytest.mark.parametrize("seed", [0, 1])
def test_a_log_of_bent_prefill_costs_is_predicted_with_its_factors(seed):
    truth = CostModel(SMOL, dataclasses.replace(LINEAR, prefill_factors=BENT))
    fitted = _fit(truth, noise=0.05, seed=seed)
    assert fitted.prefill_factors and fitted.prefill_factors[6] > 1.1
    # the factors and the per-token slope trade off, so the test is of what it charges
    bent, linear = CostModel(SMOL, fitted), CostModel(
        SMOL, dataclasses.replace(fitted, prefill_factors=()))
    worst_linear = 0.0
    for tokens in (20, 40, 80, 100, 120, 200, 300, 450):
        shape = BatchShape.of([(tokens, 0), (1, 200), (1, 200)])
        assert bent.step_time(shape) == pytest.approx(truth.step_time(shape), rel=0.05)
        worst_linear = max(worst_linear, abs(linear.step_time(shape) / truth.step_time(shape)
                                             - 1))
    assert worst_linear > 0.1  # the same coefficients without the factors miss


def test_a_linear_log_gets_no_factors():
    assert _fit(CostModel(SMOL, LINEAR), noise=0.05).prefill_factors == ()
    assert _fit(CostModel(SMOL, LINEAR), noise=0.0).prefill_factors == ()


def test_a_class_of_few_steps_or_close_to_one_keeps_factor_one():
    steps = parse_steps(_log(CostModel(SMOL, LINEAR), noise=0.0))
    plain = CostModel(SMOL, LINEAR).step_time

    def scaled(scale: float, limit: int | None = None) -> list:
        inside = [s for s in steps if size_class(s.shape.num_tokens - s.shape.num_decode_seqs)
                  == 6]
        others = [s for s in steps if s not in inside]
        return others + [dataclasses.replace(s, duration=s.duration * scale)
                         for s in inside[:limit]]

    def fit(scaled_steps: list[LoggedStep]) -> tuple[float, ...]:
        return fit_class_factors(scaled_steps, plain, prefill_tokens)

    assert fit(scaled(1.5, limit=4)) == ()  # fewer than a class needs
    assert fit(scaled(1.02)) == ()  # within MIN_DEVIATION
    assert fit(scaled(1.5)) == (1.0,) * 6 + (pytest.approx(1.5),)


shapes = st.builds(
    lambda prompt, cached, decodes, context: BatchShape.of(
        ([(prompt, cached)] if prompt else []) + [(1, context)] * decodes),
    st.integers(0, 2000), st.integers(0, 500), st.integers(0, 16), st.integers(1, 1000),
).filter(lambda s: s.num_tokens > 0)


@settings(max_examples=200, deadline=None)
@given(shapes, st.lists(st.floats(0.5, 2.0), max_size=12))
def test_only_steps_with_prefill_tokens_pay_their_class_factor(shape, factors):
    plain = CostModel(SMOL, A100)
    bent = CostModel(SMOL, dataclasses.replace(A100, prefill_factors=tuple(factors)))
    prefill = shape.num_tokens - shape.num_decode_seqs
    index = prefill.bit_length() - 1
    factor = factors[index] if prefill > 0 and index < len(factors) else 1.0
    assert bent.step_time(shape) == pytest.approx(plain.step_time(shape) * factor, rel=1e-12)
    run = bent.decode_step_times(shape, 3)  # the simulator's runs charge it alike
    assert run[0] == bent.step_time(shape)


@pytest.mark.parametrize("field", ["prefill_factors", "decode_factors"])
def test_profiles_without_factors_load_and_bad_factors_are_refused(field: str) -> None:
    data = A100.to_dict()
    del data[field]
    assert getattr(HardwareSpec.from_dict(data), field) == ()
    bent = dataclasses.replace(A100, **{field: BENT})
    assert HardwareSpec.from_json(bent.to_json()) == bent
    for bad in ((1.0, 0.0), (float("nan"),), (-1.0,)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(A100, **{field: bad})
    with pytest.raises(ValueError, match=field):
        HardwareSpec.from_dict(dict(data, **{field: "1.2"}))


def test_calibrate_reports_and_saves_the_factors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    truth = CostModel(SMOL, dataclasses.replace(LINEAR, prefill_factors=BENT))
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join(_log(truth, noise=0.05)) + "\n", encoding="utf-8")
    argv = ["calibrate", "--step-log", str(log), "--model", "smollm2-135m",
            "--base-hardware", "cpu", "--name", "bent"]
    assert main(argv) == 0
    assert "prefill size factors: " in capsys.readouterr().out
    saved = get_hardware("bent")
    assert saved.prefill_factors and saved.prefill_factors[6] > 1.1
    assert main([*argv, "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefill_factors"] == list(
        saved.prefill_factors)
    assert factors_text((1.0,) * 6 + (1.25, 1.0, 0.88)) == (
        "64-127 tokens x1.25, 256-511 tokens x0.88")
    assert factors_text((1.3, 1.1, 1.0), "decodes") == "1 decode x1.30, 2-3 decodes x1.10"
