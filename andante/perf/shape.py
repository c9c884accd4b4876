"""The composition of one engine step, reduced to what a cost model needs.

A step advances each scheduled request i by c_i tokens on top of p_i tokens already in
its KV cache. The attention work follows KunServe eq. (1): a chunk attends to its
prefix (p_i * c_i query-key pairs) and to itself ((c_i^2 + c_i) / 2 pairs, causal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class BatchShape:
    num_seqs: int = 0
    num_tokens: int = 0  # sum of c_i
    num_sampled: int = 0  # sequences that produce a token this step (LM head rows)
    num_decode_seqs: int = 0  # sequences advancing by exactly one token after their prompt
    attn_pairs: float = 0.0  # sum of p_i * c_i + (c_i^2 + c_i) / 2
    kv_tokens_read: int = 0  # sum of p_i + c_i

    def add(self, num_new_tokens: int, num_cached_tokens: int, samples: bool) -> None:
        """Account for one request advancing `num_new_tokens` past `num_cached_tokens`."""
        c = num_new_tokens
        self.num_seqs += 1
        self.num_tokens += c
        self.num_sampled += samples
        self.attn_pairs += num_cached_tokens * c + (c * c + c) * 0.5
        self.kv_tokens_read += num_cached_tokens + c
        if c == 1 and num_cached_tokens > 0:
            self.num_decode_seqs += 1

    def add_all(self, num_new_tokens: list[int], num_cached_tokens: list[int],
                samples: list[bool]) -> None:
        """`add` for each request in turn, in one call (a whole step). The attention
        pairs are summed as integers: every term is one (c^2 + c is even), so while the
        sum stays below 2^53 it equals `add`'s float sum exactly."""
        num_new = sum(num_new_tokens)
        self.num_seqs += len(num_new_tokens)
        self.num_tokens += num_new
        self.num_sampled += sum(samples)
        self.attn_pairs += sum([p * c + (c * c + c) // 2
                                for c, p in zip(num_new_tokens, num_cached_tokens, strict=True)])
        self.kv_tokens_read += sum(num_cached_tokens) + num_new
        self.num_decode_seqs += sum([c == 1 and p > 0 for c, p in
                                     zip(num_new_tokens, num_cached_tokens, strict=True)])

    @classmethod
    def decodes(cls, num_cached_tokens: list[int]) -> BatchShape:
        """An all-decode step: request i advances by one token past `num_cached_tokens[i]`
        and samples (`add(1, p, True)` for each, summed as `add_all` says)."""
        n, total = len(num_cached_tokens), sum(num_cached_tokens)
        return cls(n, n, n, n - num_cached_tokens.count(0), float(total + n), total + n)

    def copy(self) -> BatchShape:
        return BatchShape(self.num_seqs, self.num_tokens, self.num_sampled,
                          self.num_decode_seqs, self.attn_pairs, self.kv_tokens_read)

    def advance_decodes(self) -> None:
        """An all-decode step's shape becomes the next step's (every sequence one token
        longer): what a run of identical decode steps goes through."""
        self.attn_pairs += self.num_seqs
        self.kv_tokens_read += self.num_seqs

    @classmethod
    def of(cls, chunks: list[tuple[int, int]]) -> BatchShape:
        """Shape of a step from (new tokens, cached tokens) pairs; every sequence samples."""
        shape = cls()
        for num_new, num_cached in chunks:
            shape.add(num_new, num_cached, True)
        return shape

    @classmethod
    def prefill(cls, num_tokens: int, num_seqs: int = 1) -> BatchShape:
        return cls.of([(num_tokens, 0)] * num_seqs)

    @classmethod
    def decode(cls, batch_size: int, context_len: int) -> BatchShape:
        return cls.of([(1, context_len)] * batch_size)

    @property
    def is_empty(self) -> bool:
        return self.num_seqs == 0
