"""The `Tokenizer` and `IncrementalDecoder` of interface.py over a `tokenizers` backend.

Design note. Chat templates are rendered as transformers renders them: a sandboxed
Jinja2 environment with trim_blocks/lstrip_blocks, `raise_exception`, `tojson` and
`strftime_now`, then encoded without adding special tokens (the template writes them).
The incremental decoder is vLLM's `detokenize_incrementally` scheme: decode a small
window of recent ids and emit only text that no longer ends in U+FFFD (an unfinished
UTF-8 sequence split across byte-level tokens).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

# Ids of these tokens end generation when the vocabulary has them as special tokens.
END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>",
              "</s>")


class IncrementalTextDecoder:
    """Text of a growing id sequence, one token at a time (see module note)."""

    __slots__ = ("_backend", "_skip", "_ids", "_prefix", "_read", "text")

    def __init__(self, backend: Backend, skip_special_tokens: bool = True) -> None:
        self._backend = backend
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self._backend.decode
        before = decode(self._ids[self._prefix:self._read], skip_special_tokens=self._skip)
        after = decode(self._ids[self._prefix:], skip_special_tokens=self._skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        piece = after[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += piece
        return piece


def _raise(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


class TextTokenizer:
    """Implements `andante.models.interface.Tokenizer`."""

    def __init__(self, backend: Backend, eos_token_ids: Sequence[int],
                 bos_token_id: int | None, chat_template: str | None = None,
                 template_vars: dict[str, str] | None = None) -> None:
        if not eos_token_ids:
            raise ValueError("a tokenizer needs at least one end-of-sequence token id")
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template
        self._template_vars = dict(template_vars or {})
        self._compiled: Any = None
        self._max_token_chars: int | None = None

    @property
    def max_token_chars(self) -> int:
        # a vocabulary entry's characters: its bytes (byte-level BPE) or more (byte
        # fallback's "<0x41>"), never fewer than the text it decodes to
        if self._max_token_chars is None:
            vocab = self.backend.get_vocab(with_added_tokens=True)
            self._max_token_chars = max((len(token) for token in vocab), default=1)
        return self._max_token_chars

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch releases the interpreter lock while it works; encode holds it
        # (a long prompt would stall the event loop and every stream)
        encoded = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoded[0].ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def render_chat(self, messages: Sequence[dict[str, str]],
                    add_generation_prompt: bool = True) -> str:
        """The conversation as text, rendered by the model's chat template."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        if self._compiled is None:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._compiled = env.from_string(self.chat_template)
        return str(self._compiled.render(messages=list(messages),
                                         add_generation_prompt=add_generation_prompt,
                                         **self._template_vars))

    def apply_chat_template(self, messages: Sequence[dict[str, str]],
                            add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt),
                           add_special_tokens=False)

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalTextDecoder:
        return IncrementalTextDecoder(self.backend, skip_special_tokens)


def end_token_ids(backend: Backend, declared: Iterable[int | None]) -> list[int]:
    """Declared EOS ids first, then the well-known end tokens the vocabulary has."""
    ids = [i for i in declared if i is not None]
    special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    for token in END_TOKENS:
        token_id = backend.token_to_id(token)
        if token in special and token_id is not None:
            ids.append(token_id)
    return list(dict.fromkeys(ids))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(directory: Path, tok_config: dict[str, Any]) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_config.get("chat_template") or _read_json(
        directory / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _as_ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def tokenizer_from_hf_dir(directory: Path) -> TextTokenizer:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{directory}: no tokenizer.json (a fast tokenizer is required)")
    try:
        backend = Backend.from_file(str(path))
    except Exception as exc:  # the Rust library raises plain Exception
        raise ValueError(f"{path}: not a valid tokenizer ({exc})") from exc
    tok_config = _read_json(directory / "tokenizer_config.json")
    bos, eos = _token_text(tok_config.get("bos_token")), _token_text(tok_config.get("eos_token"))
    declared: list[int | None] = [backend.token_to_id(eos) if eos else None]
    declared += _as_ids(_read_json(directory / "generation_config.json").get("eos_token_id"))
    declared += _as_ids(_read_json(directory / "config.json").get("eos_token_id"))
    template_vars = {"bos_token": bos or "", "eos_token": eos or ""}
    return TextTokenizer(backend, end_token_ids(backend, declared),
                         backend.token_to_id(bos) if bos else None,
                         _chat_template(directory, tok_config), template_vars)
