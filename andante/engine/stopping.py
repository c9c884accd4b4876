"""When a request stops: stop tokens, EOS, and length limits (including KV capacity).

Design note (vLLM v1's `check_stop`, vllm/v1/core/sched/utils.py): one function decides,
after each new token, whether the request is done. Stop strings are not here: they need
the detokenizer, so the front end (the server's output processor, offline `generate`)
checks them and finishes the request. As vLLM's, a request with fewer than `min_tokens`
output tokens stops only at a length limit. The simulator's decode runs read the length rule
in its count form, `num_tokens_before_length_stop` (a test checks that both agree).
"""

from __future__ import annotations

from collections.abc import Iterable

from andante.core.request import Request, RequestStatus


def num_tokens_before_length_stop(requests: Iterable[Request], max_tokens_total: int) -> int:
    """How many more tokens each of `requests` may get before a length limit stops the
    first of them: the n-th more token stops one when this is n (0 or less: one has
    reached a limit now). `max_tokens_total`: `Scheduler.max_num_tokens`."""
    return min((min(req.sampling.max_tokens, max_tokens_total - req.num_prompt_tokens)
                - req.num_output_tokens for req in requests), default=max_tokens_total)


_STOPPED = RequestStatus.FINISHED_STOPPED
_LENGTH = RequestStatus.FINISHED_LENGTH


def check_stop(req: Request, token: int, max_tokens_total: int) -> RequestStatus | None:
    """The finished status `req` reaches with its newest token `token`, or None."""
    sampling = req.sampling
    num_output = req.num_output_tokens  # (read once: called for every token)
    if num_output >= sampling.min_tokens and (  # min_tokens bars stops until then
            token in sampling.stop_token_ids
            or (token == sampling.eos_token_id and not sampling.ignore_eos)):
        return _STOPPED
    if num_output >= sampling.max_tokens or (
            num_output + req.num_prompt_tokens >= max_tokens_total):
        return _LENGTH  # as num_tokens_before_length_stop([req]) <= 0
    return None
