"""Incremental detokenization, stop strings, stop tokens and EOS through the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from andante.core import Request, SamplingParams
from andante.llm import build_offline_engine, generate, with_eos
from andante.models import LoadedModel, load_model
from andante.models.stopping import StopStrings, truncate_at_stop
from tests.exec.engine_helpers import tiny_executor
from tests.models.gguf_helpers import write_tiny_gguf


@pytest.fixture(scope="module")
def byte_model(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = write_tiny_gguf(tiny_llama, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return load_model(path, "float32")


def test_incremental_decoder_never_splits_characters(byte_model: LoadedModel) -> None:
    tok = byte_model.tokenizer
    text = "héllo wörld 日本語 🎉 the end"
    ids = tok.encode(text)
    decoder = tok.incremental_decoder()
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) == text == decoder.text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces.count("") > 0  # multi-byte characters waited for their last byte


def test_truncate_at_stop() -> None:
    assert truncate_at_stop("abc STOP def", ("STOP",)) == "abc "
    assert truncate_at_stop("abc", ("x", "")) == "abc"
    assert truncate_at_stop("a1b2", ("2", "1")) == "a"


def _engine(model: LoadedModel):  # type: ignore[no-untyped-def]
    return build_offline_engine(model, executor=tiny_executor(model))


def test_stop_string_ends_generation(byte_model: LoadedModel) -> None:
    free = generate([[5, 17, 33, 200]], SamplingParams(max_tokens=20, temperature=0.0,
                                                       ignore_eos=True),
                    model=byte_model, engine=_engine(byte_model))[0]
    tok = byte_model.tokenizer
    prefix = tok.decode(free.token_ids[:6])
    stop = prefix[-2:]
    assert stop and stop in tok.decode(free.token_ids)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=(stop,))
    result = generate([[5, 17, 33, 200]], params, model=byte_model,
                      engine=_engine(byte_model))[0]
    assert result.finish_reason == "stop"
    assert len(result.token_ids) <= 6
    assert stop not in result.text and free.text.startswith(result.text)


def test_stop_token_and_eos(byte_model: LoadedModel) -> None:
    base = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    free = generate([[9, 9, 9]], base, model=byte_model, engine=_engine(byte_model))[0]
    target = free.token_ids[4]
    first = free.token_ids.index(target)
    for params in (SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(target,)),
                   SamplingParams(max_tokens=20, temperature=0.0, eos_token_id=target)):
        result = generate([[9, 9, 9]], params, model=byte_model, engine=_engine(byte_model))[0]
        assert result.finish_reason == "stop"
        assert result.token_ids == free.token_ids[:first + 1]
    ignored = SamplingParams(max_tokens=20, temperature=0.0, eos_token_id=target,
                             ignore_eos=True)
    result = generate([[9, 9, 9]], ignored, model=byte_model, engine=_engine(byte_model))[0]
    assert result.finish_reason == "length" and len(result.token_ids) == 20


def test_with_eos_uses_every_end_token(byte_model: LoadedModel) -> None:
    tok = byte_model.tokenizer
    params = with_eos(SamplingParams(), tok)
    assert params.eos_token_id == tok.eos_token_ids[0]
    assert set(tok.eos_token_ids[1:]) <= set(params.stop_token_ids)
    assert with_eos(SamplingParams(ignore_eos=True), tok).eos_token_id is None


def test_stop_strings_find_a_stop_that_spans_tokens(byte_model: LoadedModel) -> None:
    tok = byte_model.tokenizer
    stops = StopStrings(tok)
    ids = tok.encode("say héllo STOP now")
    req = Request("a", [1, 2], SamplingParams(stop=("STOP",)), 0.0)
    found = []
    for i, token in enumerate(ids):
        req.append_output_token(token, float(i))
        found.append(stops(req))
    first = found.index(True)
    assert tok.decode(ids[:first + 1]).endswith("STOP") and not any(found[:first])
    plain = Request("b", [1], SamplingParams(), 0.0)
    plain.append_output_token(ids[0], 0.0)
    assert stops(plain) is False
