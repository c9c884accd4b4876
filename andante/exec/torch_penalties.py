"""vLLM's logit penalties and filters: repetition, presence and frequency penalties,
min_tokens and min_p.

Design note (vLLM v1's sampler, vllm/v1/sample/sampler.py, with
vllm/model_executor/layers/utils.py `apply_penalties` and the min-tokens and min-p logits
processors of vllm/v1/sample/logits_processor/builtin.py). The order is vLLM's:

1. min_tokens (before any sampling, greedy too): while a request has fewer than
   `min_tokens` output tokens, its stop tokens (the stop token ids and the EOS token)
   get -inf, so it cannot stop early.
2. Penalties (greedy too), on the float32 logits before the temperature: a token seen in
   the prompt or the output so far has its logit divided by `repetition_penalty` when
   positive, multiplied by it otherwise; then `frequency_penalty` x (its count in the
   output) and `presence_penalty` x (1 if in the output) are subtracted. Prompt tokens
   count only for the repetition penalty.
3. min_p (random sampling only, after the temperature, before top-k / top-p): tokens
   whose probability is below `min_p` x the most likely token's probability get -inf.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from andante.core.request import Request


def needs_adjusting(req: Request) -> bool:
    """Whether `req`'s logits change before greedy or random sampling (steps 1 and 2)."""
    sampling = req.sampling
    return sampling.has_penalties or req.num_output_tokens < sampling.min_tokens


def adjust_logits(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """Float32 logits [S, V] of `requests` (row i is requests[i]) with min_tokens' stop
    masks and the penalties applied; a new tensor."""
    out = logits.float().clone()
    mask_stop_tokens(out, requests)
    rows = [i for i, r in enumerate(requests) if r.sampling.has_penalties]
    if rows:
        out[rows] = apply_penalties(out[rows], [requests[i] for i in rows])
    return out


def mask_stop_tokens(logits: torch.Tensor, requests: Sequence[Request]) -> None:
    """In place: -inf on the stop tokens of each row still short of its min_tokens."""
    vocab = logits.shape[-1]
    for i, req in enumerate(requests):
        sampling = req.sampling
        if req.num_output_tokens >= sampling.min_tokens:
            continue
        stops = set(sampling.stop_token_ids)
        if sampling.eos_token_id is not None:
            stops.add(sampling.eos_token_id)
        ids = [t for t in stops if 0 <= t < vocab]
        if ids:
            logits[i, ids] = float("-inf")


def token_counts(ids: Sequence[int], vocab: int) -> torch.Tensor:
    """How often each token id in [0, vocab) occurs in `ids`, as float32 [vocab]."""
    tensor = torch.tensor(list(ids), dtype=torch.long)
    tensor = tensor[(tensor >= 0) & (tensor < vocab)]
    return torch.bincount(tensor, minlength=vocab).float()


def apply_penalties(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """Float32 logits [S, V] after vLLM's repetition, frequency and presence penalties."""
    vocab = logits.shape[-1]
    output_counts = torch.stack([token_counts(r.output_token_ids, vocab) for r in requests])
    in_prompt = torch.stack([token_counts(r.prompt_token_ids, vocab) > 0 for r in requests])
    in_output = output_counts > 0

    def column(name: str) -> torch.Tensor:
        return torch.tensor([getattr(r.sampling, name) for r in requests]).unsqueeze(1)

    scale = torch.where(in_prompt | in_output, column("repetition_penalty"), 1.0)
    logits = logits * torch.where(logits > 0, 1.0 / scale, scale)  # vLLM's rounding
    logits = logits - column("frequency_penalty") * output_counts
    return logits - column("presence_penalty") * in_output.float()


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Logits [S, V] (after the temperature) with -inf where a token's probability is
    below min_p[i] x the row's largest probability (min_p [S]; 0 keeps every token)."""
    probs = logits.softmax(dim=-1)
    floor = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < floor, float("-inf"))
