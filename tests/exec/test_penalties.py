"""vLLM's penalties, min_p and min_tokens: the maths against hand-computed logits."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import Request, RequestStatus, SamplingParams
from andante.engine.stopping import check_stop
from andante.exec.torch_penalties import adjust_logits, apply_min_p, apply_penalties
from andante.exec.torch_sampler import Sampler

INF = float("inf")


def _req(prompt: list[int], outputs: list[int] = (), **params: object) -> Request:  # type: ignore[assignment]
    req = Request("r", prompt, SamplingParams(max_tokens=64, **params), 0.0)  # type: ignore[arg-type]
    for token in outputs:
        req.append_output_token(token, 0.0)
    return req


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 3.0]])
    req = _req([0], [1], repetition_penalty=2.0)  # 0 in the prompt, 1 in the output
    out = apply_penalties(logits, [req])
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0, 3.0]]


def test_frequency_and_presence_count_only_output_tokens() -> None:
    logits = torch.zeros(1, 4)
    req = _req([3, 3], [1, 1, 1, 2], frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(logits, [req])
    # token 1: 3 x 0.5 + 0.25; token 2: 0.5 + 0.25; token 3 (prompt only): untouched
    assert out.tolist() == [[0.0, -1.75, -0.75, 0.0]]


def test_negative_penalties_encourage() -> None:
    req = _req([0], [1], frequency_penalty=-1.0, presence_penalty=-0.5)
    assert apply_penalties(torch.zeros(1, 3), [req]).tolist() == [[0.0, 1.5, 0.0]]


def test_penalties_are_per_row() -> None:
    logits = torch.ones(2, 3)
    reqs = [_req([0], [], repetition_penalty=4.0), _req([2], [1], presence_penalty=1.0)]
    assert apply_penalties(logits, reqs).tolist() == [[0.25, 1.0, 1.0], [1.0, 0.0, 1.0]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=6, max_size=6),
       st.lists(st.integers(0, 5), max_size=8), st.floats(0.1, 3.0),
       st.floats(-2, 2), st.floats(-2, 2))
def test_penalties_match_the_scalar_formula(values: list[float], outputs: list[int],
                                            rep: float, freq: float, pres: float) -> None:
    """vLLM's formula token by token: repetition over prompt and output, then
    frequency x count and presence x seen over the output."""
    prompt = [0, 4]
    req = _req(prompt, outputs, repetition_penalty=rep, frequency_penalty=freq,
               presence_penalty=pres)
    out = apply_penalties(torch.tensor([values]), [req])[0].tolist()
    for token, value in enumerate(values):
        count = outputs.count(token)
        expected = value
        if token in prompt or count:
            expected = value / rep if value > 0 else value * rep
        expected -= freq * count + pres * (count > 0)
        assert math.isclose(out[token], expected, rel_tol=1e-5, abs_tol=1e-5)


def test_min_p_drops_tokens_below_the_scaled_top_probability() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_min_p(probs.log(), torch.tensor([0.35]))  # floor 0.175
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    assert torch.isfinite(apply_min_p(probs.log(), torch.tensor([0.0]))).all()


def test_min_tokens_masks_stop_tokens_until_reached() -> None:
    logits = torch.zeros(2, 6)
    short = _req([1], [4], min_tokens=2, eos_token_id=5, stop_token_ids=(3,))
    done = _req([1], [4, 4], min_tokens=2, eos_token_id=5, stop_token_ids=(3,))
    out = adjust_logits(logits, [short, done])
    assert out[0].tolist() == [0.0, 0.0, 0.0, -INF, 0.0, -INF]
    assert out[1].tolist() == [0.0] * 6


def test_greedy_sees_penalties_and_min_tokens() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 1.0, 5.0]])
    penalised = _req([1], [], repetition_penalty=2.0, temperature=0.0)  # 3 -> 1.5 < 2
    barred = _req([0], [], min_tokens=1, eos_token_id=3, temperature=0.0)
    plain = _req([1], [], temperature=0.0)
    sampler = Sampler()
    assert sampler.sample(logits, [penalised, barred]) == [2, 2]
    assert sampler.sample(logits[:1], [plain]) == [1]
    assert logits[0, 1] == 3.0  # the caller's logits are left as they were


def test_random_rows_obey_min_p() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(500, 3).contiguous()
    reqs = [_req([0], [], temperature=1.0, min_p=0.4) for _ in range(500)]
    drawn = set(Sampler(seed=3).sample(logits, reqs))
    assert drawn == {0, 1}  # 0.1 < 0.4 x 0.6


def test_check_stop_ignores_stop_tokens_before_min_tokens() -> None:
    req = _req([1], [7], min_tokens=2, eos_token_id=7)
    assert check_stop(req, 7, 1000) is None
    req.append_output_token(7, 0.0)
    assert check_stop(req, 7, 1000) == RequestStatus.FINISHED_STOPPED


@pytest.mark.parametrize("params", [
    {"repetition_penalty": 0.0}, {"presence_penalty": 2.5}, {"frequency_penalty": -3.0},
    {"min_p": 1.5}, {"min_tokens": -1}, {"min_tokens": 65},
])
def test_out_of_range_values_are_refused(params: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(params))):
        SamplingParams(max_tokens=64, **params)  # type: ignore[arg-type]
