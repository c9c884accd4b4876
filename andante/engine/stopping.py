"""When a request stops: stop tokens, EOS, and length limits (including KV capacity).

Design note (vLLM v1's `check_stop`, vllm/v1/core/sched/utils.py): one function decides,
after each new token, whether the request is done. Stop strings are not here: they need
the detokenizer, so the front end (the server's output processor, offline `generate`)
checks them and finishes the request. The length rules are one count,
`num_tokens_before_length_stop`, which the simulator's decode runs also read.
"""

from __future__ import annotations

from andante.core.request import Request, RequestStatus


def max_num_tokens(max_model_len: int, cache_tokens: int) -> int:
    """The length (prompt + output) at which a request stops: the model's context, or
    the whole device KV cache (its next token could never fit)."""
    return min(max_model_len, cache_tokens)


def num_tokens_before_length_stop(req: Request, max_tokens_total: int) -> int:
    """How many more tokens `req` may get before a length limit stops it: the n-th more
    token stops it when this is n (0 or less: it has reached a limit now).
    `max_tokens_total` comes from `max_num_tokens`."""
    return (min(req.sampling.max_tokens, max_tokens_total - req.num_prompt_tokens)
            - req.num_output_tokens)


def check_stop(req: Request, token: int, max_tokens_total: int) -> RequestStatus | None:
    """The finished status `req` reaches with its newest token `token`, or None."""
    sampling = req.sampling
    if token in sampling.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if not sampling.ignore_eos and token == sampling.eos_token_id:
        return RequestStatus.FINISHED_STOPPED
    if num_tokens_before_length_stop(req, max_tokens_total) <= 0:
        return RequestStatus.FINISHED_LENGTH
    return None
