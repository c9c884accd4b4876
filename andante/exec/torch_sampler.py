"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Design note. Greedy rows take the argmax of the logits. Other rows are divided by their
temperature, filtered (min_p as `torch_penalties` describes; then top-k keeps the k
largest logits; top-p keeps the smallest prefix of the descending order whose
probability mass reaches p, as vLLM does), and sampled with the exponential race
argmax(p_i / E_i), E_i ~ Exp(1), which draws i with probability p_i. A seeded request
draws its noise from a generator seeded with (seed, output index), so its tokens do not
depend on the batch it shares, nor on whether it was preempted, swapped or recomputed in
between; unseeded rows share the executor's generator. Before either, rows with vLLM's
repetition / presence / frequency penalties or an unmet min_tokens have their logits
adjusted as vLLM's sampler does (`torch_penalties`).

Greedy rows are most of a serving step's sampling, and torch's CPU `argmax` over a
[S, 49,152] row is a scalar loop (about 1.2 ms at S = 16 on this CPU, 2% of a batch-16
decode step). `first_argmax` finds the same index (the first maximum) in two vectorised
passes: the maximum of each 1,024-wide block, then an argmax inside the first block
that holds the row's maximum, 3-4x faster.
"""

from __future__ import annotations

import torch

from andante.core.request import Request
from andante.exec.torch_penalties import adjust_logits, apply_min_p, needs_adjusting

_MIX = 0x9E3779B97F4A7C15  # golden-ratio multiplier: spreads (seed, index) pairs
_MASK63 = (1 << 63) - 1


#: Block width of `first_argmax`'s two-pass search.
ARGMAX_BLOCK = 1024


def first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """`logits.float().argmax(dim=-1)` of [S, V] logits (the first index of each row's
    maximum, as torch's argmax): the float32 copy is padded with -inf to whole blocks,
    the first block whose maximum equals the row's maximum is found from the blocks'
    maxima, and the index is taken inside that block."""
    rows, vocab = logits.shape
    num_blocks = -(-vocab // ARGMAX_BLOCK)
    padded = torch.empty(rows, num_blocks * ARGMAX_BLOCK, dtype=torch.float32)
    padded[:, vocab:] = float("-inf")
    padded[:, :vocab].copy_(logits)
    blocks = padded.view(rows, num_blocks, ARGMAX_BLOCK)
    first = blocks.amax(dim=-1).argmax(dim=-1)
    inner = blocks[torch.arange(rows), first].argmax(dim=-1)
    return first * ARGMAX_BLOCK + inner


def step_seed(seed: int, index: int) -> int:
    """The generator seed of output token `index` of a request seeded with `seed`."""
    return (seed * _MIX + index * 0xBF58476D1CE4E5B9 + 1) & _MASK63


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                       top_p: torch.Tensor | None) -> torch.Tensor:
    """Logits [S, V] with the tokens outside each row's top-k / top-p set at -inf.

    top_k: [S] long (V = keep all); top_p: [S] float (1.0 = keep all).
    """
    ordered, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1]).unsqueeze(0)
        ordered = ordered.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    if top_p is not None:
        probs = ordered.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
        ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(-1, order, ordered)


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """One token per row of `logits` [S, V]; `requests[i]` owns row i. Greedy rows take
        the argmax of the logits as the GEMM rounded them (`first_argmax`: bfloat16 is
        upcast first only because float32 is faster on CPU; the conversion is exact, so
        the winner and the tie-break, the first index, are the same). Rows with vLLM's
        penalties or an unmet min_tokens are adjusted first (`torch_penalties`), so their
        greedy choice sees them too."""
        adjusted = [i for i, r in enumerate(requests) if needs_adjusting(r)]
        if adjusted:
            logits = logits.float().clone()
            logits[adjusted] = adjust_logits(logits[adjusted], [requests[i] for i in adjusted])
        tokens: list[int] = first_argmax(logits).tolist()
        rows = [i for i, r in enumerate(requests) if not r.sampling.is_greedy]
        if not rows:
            return tokens
        params = [requests[i].sampling for i in rows]
        sub = logits[rows].float() / torch.tensor([p.temperature for p in params]).unsqueeze(1)
        vocab = sub.shape[-1]
        if any(p.min_p > 0 for p in params):
            sub = apply_min_p(sub, torch.tensor([p.min_p for p in params]))
        top_k = top_p = None
        if any(p.top_k is not None for p in params):
            top_k = torch.tensor([min(p.top_k or vocab, vocab) for p in params])
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params])
        if top_k is not None or top_p is not None:
            sub = filter_top_k_top_p(sub, top_k, top_p)
        probs = sub.softmax(dim=-1)
        noise = torch.empty_like(probs)
        for j, i in enumerate(rows):
            req = requests[i]
            gen = self.generator
            if req.sampling.seed is not None:
                gen = torch.Generator().manual_seed(
                    step_seed(req.sampling.seed, len(req.output_token_ids)))
            noise[j].exponential_(generator=gen)
        picked = (probs / noise).argmax(dim=-1).tolist()
        for j, i in enumerate(rows):
            tokens[i] = picked[j]
        return tokens
