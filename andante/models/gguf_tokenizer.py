"""The tokenizer and chat template stored in a GGUF file's metadata.

Design note. Byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`) are rebuilt
directly with the `tokenizers` library in well under a second, using the pre-tokenizer
llama.cpp applies for the file's `tokenizer.ggml.pre` (llama-vocab.cpp): `smollm`,
`starcoder`, `refact`... split digits one by one and then apply GPT-2's regex;
`llama-bpe` and `qwen2` use their own regexes. Control tokens become special added
tokens. Anything else (SentencePiece `llama` vocabularies, other pre-tokenizers) is
converted by transformers' GGUF converter (~10 s) and the result cached as
`<andante home>/tokenizers/<key>.json`, keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from andante.models.gguf_reader import GGUFFile
from andante.models.tokenizer import TextTokenizer, end_token_ids
from andante.perf.paths import andante_home

_CONTROL, _USER_DEFINED = 3, 4
_LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                 r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva")
_GPT2 = ("gpt2", "default", "")


def _pre_tokenizer(pre: str) -> Any | None:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _GPT2:
        return byte_level
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    regex = {"llama-bpe": _LLAMA3_REGEX, "llama3": _LLAMA3_REGEX, "qwen2": _QWEN2_REGEX}
    if pre not in regex:
        return None
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _native_bpe(fields: dict[str, Any]) -> Backend | None:
    """A byte-level BPE tokenizer from GGUF metadata, or None if not supported here."""
    pre = str(fields.get("tokenizer.ggml.pre", "default"))
    pre_tokenizer = _pre_tokenizer(pre)
    if fields.get("tokenizer.ggml.model") != "gpt2" or pre_tokenizer is None:
        return None
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False,
                     ignore_merges=pre in ("llama-bpe", "llama3"))
    backend = Backend(bpe)
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    types = fields.get("tokenizer.ggml.token_type", [])
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, t in enumerate(types) if t == _CONTROL])
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, t in enumerate(types) if t == _USER_DEFINED])
    return backend


def _cache_path(path: Path) -> Path:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return andante_home() / "tokenizers" / f"{digest}.json"


def _converted(path: Path) -> Backend:
    """transformers' conversion of the GGUF tokenizer, cached on disk."""
    cache = _cache_path(path)
    if cache.is_file():
        return Backend.from_file(str(cache))
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ValueError(f"{path}: converting this GGUF tokenizer needs transformers") from exc
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # transformers raises many kinds
        raise ValueError(f"{path}: cannot convert its tokenizer ({exc})") from exc
    backend: Backend = tok.backend_tokenizer
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(backend.to_str(), encoding="utf-8")
    tmp.replace(cache)
    return backend


def _add_bos(backend: Backend, fields: dict[str, Any], bos: str | None) -> None:
    if bos is None or not fields.get("tokenizer.ggml.add_bos_token", False):
        return
    bos_id = backend.token_to_id(bos)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])


def tokenizer_from_gguf(gguf: GGUFFile) -> TextTokenizer:
    fields = gguf.fields
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{gguf.path}: GGUF metadata has no tokenizer")
    native = _native_bpe(fields)
    backend = native if native is not None else _converted(gguf.path)

    def token(key: str) -> str | None:
        index = fields.get(f"tokenizer.ggml.{key}")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    bos, eos, eot = token("bos_token_id"), token("eos_token_id"), token("eot_token_id")
    if native is not None:
        _add_bos(native, fields, bos)
    declared = [backend.token_to_id(t) for t in (eos, eot) if t is not None]
    template = fields.get("tokenizer.chat_template")
    return TextTokenizer(backend, end_token_ids(backend, declared),
                         backend.token_to_id(bos) if bos else None,
                         template if isinstance(template, str) else None,
                         {"bos_token": bos or "", "eos_token": eos or ""})
