"""Issue #26, items 1, 2 and 13: bodies that cost the server more than they should, and
the small wrongs of its messages. Each test fails with its fix reverted."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from pydantic import ValidationError

from andante.runtime.durable.records import window_seconds
from andante.server import ServerThread, build_backend
from andante.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.server.helpers import toy_options
from tests.server.test_hardening import ThreadRecordingTokenizer

MILLION_ONES = b",".join([b"1"] * 1_000_000)


@pytest.mark.parametrize(("model", "raw"), [
    (ChatCompletionRequest, b'{"messages":[' + MILLION_ONES + b"]}"),
    (CompletionRequest, b'{"prompt":[' + b",".join([b"{}"] * 300_000) + b"]}"),
    (CompletionRequest, b'{"prompt":"x","stop_token_ids":[' + MILLION_ONES + b"]}"),
    (ChatCompletionRequest, b'{"messages":[{"role":"user","content":['
     + b",".join([b'{"type":"text","text":"a"}'] * 100_000) + b"]}]}"),
])
def test_a_huge_list_is_refused_with_a_handful_of_errors(model: type, raw: bytes) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(raw)
    assert caught.value.error_count() <= 4  # not one per item (1.4M took 6 s)


def test_oversized_lists_get_a_400_naming_the_bound(server: ServerThread) -> None:
    body = {"prompt": "hi", "stop_token_ids": [1] * 1000}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400
    assert "at most 256" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [1] * 10_000})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")


def test_five_stop_strings_say_at_most_4(server: ServerThread) -> None:
    body = {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400
    assert "at most 4" in r.json()["error"]["message"]


@pytest.mark.parametrize("chat", [False, True])
def test_a_text_too_long_to_fit_is_refused_before_tokenizing(chat: bool) -> None:
    tokenizer = ThreadRecordingTokenizer()
    options = toy_options(max_model_len=64)
    backend = dataclasses.replace(build_backend(options), tokenizer=tokenizer)
    text = "x" * 65  # the toy's tokens are bytes: 65 characters are at least 65 tokens
    with ServerThread(options, backend) as srv:
        if chat:
            r = httpx.post(srv.url + "/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": text}]})
        else:
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": text})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert "characters" in r.json()["error"]["message"]
    assert tokenizer.threads == []  # never tokenized


def test_a_text_tokenizer_knows_its_longest_token_and_encodes_off_the_lock() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from andante.models.tokenizer import TextTokenizer

    backend = Tokenizer(models.WordLevel({"a": 0, "hello": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = TextTokenizer(backend, [2], None)
    assert tokenizer.max_token_chars == 5
    assert tokenizer.encode("hello a b") == backend.encode("hello a b").ids == [1, 0, 2]


def test_unknown_ids_are_not_echoed_whole(server: ServerThread) -> None:
    long_id = "f" * 100_000
    r = httpx.post(server.url + "/v1/batches", json={
        "input_file_id": long_id, "endpoint": "/v1/completions"})
    assert r.status_code == 404
    assert len(r.text) < 1000


@pytest.mark.parametrize("window", ["٢٤h", "24h\n", "9223372036854775807s", "31d", "0h"])
def test_a_completion_window_is_ascii_digits_and_bounded(window: str) -> None:
    with pytest.raises(ValueError, match="completion_window"):
        window_seconds(window)
    assert window_seconds("24h") == 86400 and window_seconds("30d") == 30 * 86400


def test_a_bare_cancel_is_not_a_415(server: ServerThread) -> None:
    r = httpx.post(server.url + "/v1/batches/batch_nope/cancel")
    assert r.status_code == 404, r.text  # reached the route: no such batch


def test_serve_help_says_the_api_key_covers_every_path() -> None:
    import argparse

    from andante.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    sub = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]  # noqa: SLF001
    help_text = next(a.help for a in sub._actions if "--api-key" in a.option_strings)  # noqa: SLF001
    assert help_text is not None and "every path but /health" in help_text
