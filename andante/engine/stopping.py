"""When a request stops: stop tokens, EOS, length limits, and KV capacity."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from andante.core.request import Request, RequestStatus


class StopChecker(Protocol):
    """Extra stop rule applied after each new token (e.g. stop strings, which need the
    detokenizer). Returns True when the request should stop."""

    def __call__(self, req: Request) -> bool: ...


class StopLimits(NamedTuple):
    max_model_len: int  # prompt + output tokens
    cache_tokens: int  # tokens the whole device KV cache holds


def stop_status(
    req: Request,
    token: int,
    limits: StopLimits,
    stop_checker: StopChecker | None,
) -> RequestStatus | None:
    """The finished status `req` reaches with its newest `token`, or None to go on."""
    sampling = req.sampling
    if token in sampling.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if not sampling.ignore_eos and token == sampling.eos_token_id:
        return RequestStatus.FINISHED_STOPPED
    if stop_checker is not None and stop_checker(req):
        return RequestStatus.FINISHED_STOPPED
    num_tokens = req.num_tokens
    if len(req.output_token_ids) >= sampling.max_tokens or num_tokens >= limits.max_model_len:
        return RequestStatus.FINISHED_LENGTH
    if num_tokens + 1 > limits.cache_tokens:
        return RequestStatus.FINISHED_LENGTH  # the next token could never fit the cache
    return None
