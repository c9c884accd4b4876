"""API body -> engine Request: objectives, priority, sampling, stop tokens."""

from __future__ import annotations

import pytest

from andante.core import SLO
from andante.server import build_backend
from andante.server.admission import Admission
from andante.server.errors import APIError
from andante.server.protocol import ChatCompletionRequest, CompletionRequest
from andante.server.toy import ENDOFTEXT, IM_END
from tests.server.helpers import toy_options


@pytest.fixture(scope="module")
def admission() -> Admission:
    return Admission(build_backend(toy_options()))


def test_objectives_priority_and_sampling(admission: Admission) -> None:
    body = CompletionRequest.model_validate_json(
        '{"prompt": "hey", "max_tokens": 7, "temperature": 0, "top_k": 5, "seed": 3,'
        ' "stop": ["x", ""], "priority": -2,'
        ' "slo": {"ttft": 0.5, "tbt": 0.1, "tds": 4.8, "deadline": 9}}')
    r = admission.admit(body, admission.completion_prompt(body), body.max_tokens, "r", 1.5)
    assert list(r.prompt_token_ids) == list(b"hey")
    assert (r.priority, r.arrival_time, r.model) == (-2, 1.5, "toy")
    assert r.slo == SLO(ttft=0.5, tbt=0.1, tds=4.8, deadline=9.0)
    s = r.sampling
    assert (s.max_tokens, s.temperature, s.top_k, s.seed) == (7, 0.0, 5, 3)
    assert s.stop == ("x",)
    assert s.eos_token_id == IM_END and ENDOFTEXT in s.stop_token_ids


def test_ignore_eos_keeps_only_explicit_stop_ids(admission: Admission) -> None:
    body = CompletionRequest.model_validate_json(
        '{"prompt": "a", "ignore_eos": true, "stop_token_ids": [65]}')
    s = admission.admit(body, [97], 3, "r", 0.0).sampling
    assert s.ignore_eos and s.stop_token_ids == (65,)


def test_chat_default_max_tokens_fills_the_context(admission: Admission) -> None:
    body = ChatCompletionRequest.model_validate_json(
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}')
    prompt = admission.chat_prompt(body)
    req = admission.admit(body, prompt, body.max_output_tokens, "c", 0.0)
    assert req.sampling.max_tokens == admission.backend.limits.max_model_len - len(prompt)


def test_refusals_name_the_field(admission: Admission) -> None:
    body = CompletionRequest.model_validate_json('{"prompt": "a"}')
    with pytest.raises(APIError) as err:
        admission.admit(body, [1] * 5000, 1, "r", 0.0)
    assert err.value.status == 400 and err.value.param == "prompt"
    with pytest.raises(APIError) as err:
        admission.check_model("other")
    assert err.value.status == 404
