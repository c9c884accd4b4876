"""The real `openai` package against a live toy server."""

from __future__ import annotations

import openai
import pytest

from andante.server import ServerThread
from andante.server.toy import TOY_TEXT, ByteTokenizer


@pytest.fixture
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["toy"]


def test_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(model="toy", prompt="Hello", max_tokens=9)
    assert out.object == "text_completion"
    assert out.choices[0].text == TOY_TEXT[:9]
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (5, 9)


def test_streaming_completion_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(model="toy", prompt="Hello", max_tokens=12, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == TOY_TEXT[:12]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_completion(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == TOY_TEXT[:5]
    template = ByteTokenizer().apply_chat_template([{"role": "user", "content": "hi"}])
    assert out.usage is not None and out.usage.prompt_tokens == len(template)


def test_streaming_chat(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="toy", messages=[{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "hi"}],
        max_tokens=7, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == TOY_TEXT[:7]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_stop_string_is_not_returned(client: openai.OpenAI) -> None:
    out = client.completions.create(model="toy", prompt="x", max_tokens=40, stop=["brown"])
    assert out.choices[0].text == "The quick "
    assert out.choices[0].finish_reason == "stop"
    stream = client.completions.create(model="toy", prompt="x", max_tokens=40, stop="fox",
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == "The quick brown "


def test_slo_and_priority_are_accepted(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model="toy", prompt="Hello", max_tokens=3,
        extra_body={"slo": {"ttft": 1.0, "tbt": 0.2, "tds": 4.8, "deadline": 30}, "priority": -1})
    assert out.choices[0].text == TOY_TEXT[:3]


def test_token_id_prompt(client: openai.OpenAI) -> None:
    out = client.completions.create(model="toy", prompt=[72, 105], max_tokens=2)
    assert out.usage is not None and out.usage.prompt_tokens == 2


def test_api_key_is_enforced() -> None:
    from tests.server.helpers import toy_server

    with toy_server(api_key="sesame") as srv:
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sesame", max_retries=0)
        assert good.completions.create(model="toy", prompt="a", max_tokens=1).choices
