"""Synthetic prompts of a requested token length.

Two formats (`--prompt-format`):

* `tokens[:LOW:HIGH]` (default `tokens:1000:41000`): the prompt is sent as a list of
  token ids drawn uniformly from [LOW, HIGH) — exact lengths on any server that accepts
  token-id prompts on /v1/completions (andante, vLLM). Ids below 1000 hold the special
  tokens of common vocabularies; HIGH must not exceed the model's vocabulary (49,152
  for SmolLM2). The same seed gives the same ids, as in
  benchmarks/vllm_peer/vllm_offline_bench.py.
* `text`: English words drawn from a list of short common words, one word per
  requested token, separated by spaces. With BPE vocabularies (GPT-2, Llama, SmolLM2)
  such words are single tokens, so the length is close to the request (not exact); the
  chat endpoint adds its template's tokens on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "it", "an", "are", "this", "be", "or", "which", "had", "not", "but",
    "one", "they", "were", "have", "all", "he", "she", "we", "you", "their", "there", "been",
    "has", "when", "who", "will", "more", "no", "if", "out", "so", "up", "said", "what", "its",
    "about", "than", "into", "them", "can", "only", "other", "new", "some", "could", "time",
    "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our",
    "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before",
    "must", "through", "back", "years", "where", "much", "your", "way", "well", "down",
    "should", "because", "each", "just", "those", "people", "how", "too", "little", "state",
    "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get",
    "here", "between", "both", "life", "being", "under", "never"
)


@dataclass(frozen=True, slots=True)
class PromptFormat:
    kind: str  # "tokens" or "text"
    low: int = 1000
    high: int = 41000

    @classmethod
    def parse(cls, text: str) -> PromptFormat:
        kind, *rest = text.split(":")
        if kind == "text" and not rest:
            return cls("text")
        if kind == "tokens" and len(rest) in (0, 2):
            if not rest:
                return cls("tokens")
            try:
                low, high = int(rest[0]), int(rest[1])
            except ValueError:
                raise ValueError(f"bad prompt format {text!r}: LOW and HIGH must be "
                                 "integers") from None
            if not 0 <= low < high:
                raise ValueError(f"bad prompt format {text!r}: need 0 <= LOW < HIGH")
            return cls("tokens", low, high)
        raise ValueError(f"bad prompt format {text!r}; expected tokens[:LOW:HIGH] or text")


def synthesize(fmt: PromptFormat, num_tokens: int, rng: np.random.Generator) -> str | list[int]:
    """A prompt of `num_tokens` tokens (exact for "tokens", approximate for "text")."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if fmt.kind == "tokens":
        return [int(t) for t in rng.integers(fmt.low, fmt.high, size=num_tokens)]
    picks = rng.integers(0, len(WORDS), size=num_tokens)
    return " ".join(WORDS[i] for i in picks)
