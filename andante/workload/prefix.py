"""Prompts that share prefixes, for the prefix cache in simulated workloads.

A simulated prompt has no real tokens (`SyntheticTokens`), so what two prompts share is
told by content ids (`PrefixIds`): id k names the content of the prompt's tokens
[k * span, (k + 1) * span), and equal ids mean equal content. The block manager hashes
them into its own blocks (`andante.kv.prefix_cache`). Three sources:

* a trace's block hash ids (Mooncake's `hash_ids`, 512-token blocks): `with_trace_ids`;
* a shared system prompt of N tokens before every request's own prompt (the case of
  vLLM's and SGLang's prefix-caching benchmarks): `with_system_prompt`;
* multi-turn conversations (SGLang's RadixAttention §3, multi-turn chat): the workload's
  requests are the turns of C conversations in turn (request i continues conversation
  i mod C), and each turn's prompt is the previous turn's prompt + its answer + the new
  user text (the request's own sampled prompt length): `as_conversations`. A
  conversation whose next turn would exceed `max_context` starts afresh.

The cached prefix that a request can find is then exactly computable:
`expected_hit_tokens` gives it, assuming that every earlier request has finished and
nothing was evicted. A span equal to the engine's block size (16, both defaults) loses
no hit; another span loses the blocks of a span that only partly repeats (a span where
an answer ends and new text begins gets a new id).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

from andante.core.request import PrefixIds
from andante.workload.spec import RequestSpec
from andante.workload.traces import Trace

DEFAULT_SPAN = 16  # tokens per content id: the engine's default block size
KINDS = ("system", "conversation")
FORM = "system:N[:SPAN] or conversation:C[:SPAN]"


@dataclass(frozen=True, slots=True)
class PrefixSharing:
    """`system` with `size` = the system prompt's tokens, or `conversation` with
    `size` = the number of conversations; `span` tokens per content id."""

    kind: str
    size: int
    span: int = DEFAULT_SPAN

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"prefix sharing {self.kind!r}: expected {FORM}")
        if self.size < 1 or self.span < 1:
            raise ValueError(f"prefix sharing {self.kind}:{self.size}:{self.span}: "
                             "sizes must be >= 1")


def parse_prefix_sharing(text: str) -> PrefixSharing:
    """"system:1000", "conversation:8" or either with ":SPAN"; ValueError if malformed."""
    kind, *numbers = text.split(":")
    try:
        values = [int(n) for n in numbers]
    except ValueError:
        raise ValueError(f"prefix sharing {text!r}: expected {FORM}") from None
    if len(values) not in (1, 2):
        raise ValueError(f"prefix sharing {text!r}: expected {FORM}")
    return PrefixSharing(kind, *values)


def _spans(num_tokens: int, span: int) -> int:
    return -(-num_tokens // span)


def with_system_prompt(specs: Sequence[RequestSpec], num_tokens: int,
                       span: int = DEFAULT_SPAN) -> list[RequestSpec]:
    """Each prompt preceded by the same `num_tokens`-token system prompt (its full
    spans share ids; the span where the request's own text starts is its own)."""
    num_shared = num_tokens // span
    shared = tuple(range(num_shared))
    fresh = count(num_shared)
    out: list[RequestSpec] = []
    for spec in specs:
        total = num_tokens + spec.prompt_len
        ids = shared + tuple(next(fresh) for _ in range(_spans(total, span) - num_shared))
        out.append(dataclasses.replace(spec, prompt_len=total,
                                       prefix=PrefixIds(ids, span, total)))
    return out


def as_conversations(specs: Sequence[RequestSpec], num_conversations: int,
                     span: int = DEFAULT_SPAN, max_context: int | None = None
                     ) -> list[RequestSpec]:
    """Request i becomes the next turn of conversation i mod `num_conversations`: its
    prompt = that conversation's previous prompt + answer + its own prompt length. The
    ids cover the answer too (the next turn repeats it)."""
    fresh = count()
    history: dict[int, tuple[tuple[int, ...], int]] = {}  # ids, tokens they cover
    out: list[RequestSpec] = []
    for i, spec in enumerate(specs):
        ids, covered = history.get(i % num_conversations, ((), 0))
        if max_context is not None and covered + spec.prompt_len + spec.output_len > max_context:
            ids, covered = (), 0  # too long: a new conversation
        prompt = covered + spec.prompt_len
        total = prompt + spec.output_len
        kept = ids[:covered // span]  # the last, partial span now holds new text
        ids = kept + tuple(next(fresh) for _ in range(_spans(total, span) - len(kept)))
        history[i % num_conversations] = (ids, total)
        out.append(dataclasses.replace(spec, prompt_len=prompt,
                                       prefix=PrefixIds(ids, span, total)))
    return out


def with_trace_ids(specs: Sequence[RequestSpec], trace: Trace) -> list[RequestSpec]:
    """Attach a trace's block ids (in trace order) to the specs made from its rows."""
    if trace.prefix_ids is None:
        return list(specs)
    span = trace.prefix_span
    return [dataclasses.replace(spec, prefix=PrefixIds(
        ids, span, min(spec.prompt_len, len(ids) * span))) if ids else spec
        for spec, ids in zip(specs, trace.prefix_ids, strict=True)]


def apply_prefix_sharing(specs: Sequence[RequestSpec], sharing: str | None,
                         max_context: int | None = None) -> list[RequestSpec]:
    """The workload with the prompts that `sharing` (see `parse_prefix_sharing`)
    describes; unchanged if None."""
    if sharing is None:
        return list(specs)
    parsed = parse_prefix_sharing(sharing)
    if parsed.kind == "system":
        return with_system_prompt(specs, parsed.size, parsed.span)
    return as_conversations(specs, parsed.size, parsed.span, max_context)


def expected_hit_tokens(specs: Sequence[RequestSpec], block_size: int) -> list[int]:
    """Each request's cached prefix in tokens (at most its prompt but one token), if
    every earlier request had finished (its computed full blocks cached: all its tokens
    but the last output token) and nothing was evicted. Block j of a prompt is the
    content of the ids up to the span holding its last token."""
    cached: set[tuple[tuple[int, ...], int]] = set()
    hits: list[int] = []
    for spec in specs:
        prefix = spec.prefix
        if prefix is None:
            hits.append(0)
            continue
        keys = [(prefix.ids[:((j + 1) * block_size - 1) // prefix.span_tokens + 1], j)
                for j in range(prefix.num_tokens // block_size)]
        usable = min(len(keys), (spec.prompt_len - 1) // block_size)
        hit = 0
        while hit < usable and keys[hit] in cached:
            hit += 1
        hits.append(hit * block_size)
        computed = min(spec.prompt_len + spec.output_len - 1, prefix.num_tokens)
        cached.update(keys[:computed // block_size])
    return hits
