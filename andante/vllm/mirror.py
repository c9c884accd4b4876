"""andante's view of a vLLM request: the `Request` andante's policies read.

Design note. A policy reads andante `Request`s (prompt and output lengths, computed
tokens, status, arrival, SLO, the token timeline its QoE is computed from). The adapter
keeps one per vLLM request (`mirror`), created when vLLM adds the request and kept in
step with it: its computed tokens before each step, its status on each transition the
adapter applies, and each token vLLM samples appended at the time the step ended, so
the timeline is the one the engine produced. Times are seconds on the adapter's clock
(`time.time()` less an origin), vLLM's arrival times converted to it.

Per-request SLOs travel in vLLM's `vllm_xargs` (SamplingParams.extra_args) as flat keys
`ttft`, `tbt`, `deadline` (seconds) and `tds` (tokens/s); missing keys keep andante's
server defaults (none set: the policies use a TTFT target of 1 s and a reading speed of
4.8 tokens/s). `priority` is vLLM's own request field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from andante.core.request import Request, RequestStatus
from andante.core.sampling import SLO, SamplingParams

if TYPE_CHECKING:
    from vllm.v1.request import Request as VllmRequest

SLO_KEYS = ("ttft", "tbt", "tds", "deadline")


class SLOError(ValueError):
    """A request's vllm_xargs SLO field that is not a positive number."""


def slo_from_extra_args(extra_args: dict[str, Any] | None) -> SLO:
    """The SLO in a request's vllm_xargs (SLO() when it carries none)."""
    if not extra_args:
        return SLO()
    values: dict[str, float] = {}
    for key in SLO_KEYS:
        value = extra_args.get(key)
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise SLOError(f"vllm_xargs.{key} must be a positive number, got {value!r}") \
                from None
        values[key] = number
    try:
        return SLO(**values)
    except ValueError as exc:
        raise SLOError(f"vllm_xargs: {exc}") from None


def mirror(req: VllmRequest, origin: float, slo: SLO) -> Request:
    """andante's Request for a new vLLM request (WAITING, nothing computed)."""
    prompt = req.prompt_token_ids
    if prompt is None:  # prompt embeddings: lengths are all a policy needs
        prompt = [0] * req.num_prompt_tokens
    return Request(
        request_id=req.request_id, prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=max(1, req.max_tokens)),
        arrival_time=req.arrival_time - origin, priority=req.priority, slo=slo,
    )


FINISHED_STATUS = {  # vLLM's finished statuses by name -> andante's
    "FINISHED_STOPPED": RequestStatus.FINISHED_STOPPED,
    "FINISHED_LENGTH_CAPPED": RequestStatus.FINISHED_LENGTH,
    "FINISHED_REPETITION": RequestStatus.FINISHED_STOPPED,
    "FINISHED_ABORTED": RequestStatus.FINISHED_ABORTED,
    "FINISHED_IGNORED": RequestStatus.FINISHED_REJECTED,
    "FINISHED_ERROR": RequestStatus.FINISHED_ABORTED,
}


def finished_status(vllm_status: Any) -> RequestStatus:
    return FINISHED_STATUS.get(getattr(vllm_status, "name", str(vllm_status)),
                               RequestStatus.FINISHED_ABORTED)
