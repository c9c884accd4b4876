"""One request's timeline as the metrics see it: a frozen, engine-independent record.

The simulator and the server build records from `Request` objects; the HTTP benchmark
client builds them directly from what it observed on the stream. Every metric in this
package is a pure function of these records (DESIGN.md §2 rule 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from andante.core.request import Request
from andante.core.sampling import SLO

#: finish reasons that mean the request did not complete normally.
ABORTED_REASONS: frozenset[str] = frozenset({"abort", "rejected", "error"})


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request, in seconds of one clock.

    token_times: each output token's arrival at the client (or stream), non-decreasing.
    finish_reason: None while in flight; "stop"/"length" (or any other OpenAI reason)
    when it completed; one of `ABORTED_REASONS` when it was aborted or refused.
    max_tokens: the output cap, if known; bounds mid-flight QoE and tells a request cut
    by a length limit (`is_truncated`). rejection_reason: why it was refused, if it was.
    """

    request_id: str
    arrival_time: float
    token_times: tuple[float, ...] = ()
    num_prompt_tokens: int = 0
    slo: SLO = field(default_factory=SLO)
    finish_reason: str | None = None
    num_preemptions: int = 0
    max_tokens: int | None = None
    rejection_reason: str | None = None
    num_prefix_query_tokens: int = 0  # prefix cache: tokens looked up at admissions
    num_prefix_hit_tokens: int = 0  # of them, cached (prefill saved)

    def __post_init__(self) -> None:
        if not isinstance(self.token_times, tuple):
            object.__setattr__(self, "token_times", tuple(self.token_times))
        if self.token_times and self.token_times[0] < self.arrival_time:
            raise ValueError(
                f"request {self.request_id!r}: first token at {self.token_times[0]!r} "
                f"precedes arrival at {self.arrival_time!r}"
            )
        if self.num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {self.num_prompt_tokens}")
        if self.num_preemptions < 0:
            raise ValueError(f"num_preemptions must be >= 0, got {self.num_preemptions}")
        if self.max_tokens is not None and self.max_tokens < len(self.token_times):
            raise ValueError(
                f"request {self.request_id!r}: {len(self.token_times)} tokens "
                f"exceed max_tokens={self.max_tokens}"
            )

    @classmethod
    def from_request(cls, req: Request, delivery_delay: float = 0.0) -> RequestRecord:
        """Snapshot a core `Request` (finished or still in flight). `delivery_delay`:
        seconds from the engine's emission of a token to the client's receipt (a
        simulated server's front end, andante.sim.simulator); each token time moves by it."""
        times = req.timeline.token_times
        return cls(
            request_id=req.request_id,
            arrival_time=req.arrival_time,
            token_times=tuple(t + delivery_delay for t in times) if delivery_delay
            else tuple(times),
            num_prompt_tokens=req.num_prompt_tokens,
            slo=req.slo,
            finish_reason=req.finish_reason,
            num_preemptions=len(req.timeline.preemption_times),
            max_tokens=req.sampling.max_tokens,
            rejection_reason=req.timeline.rejection_reason,
            num_prefix_query_tokens=req.timeline.num_prefix_query_tokens,
            num_prefix_hit_tokens=req.timeline.num_prefix_hit_tokens,
        )

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def is_finished(self) -> bool:
        """Terminal in any way: completed, aborted or rejected."""
        return self.finish_reason is not None

    @property
    def is_aborted(self) -> bool:
        return self.finish_reason in ABORTED_REASONS

    @property
    def is_rejected(self) -> bool:
        return self.finish_reason == "rejected"

    @property
    def is_truncated(self) -> bool:
        """Stopped by a length limit (the context or the KV cache) before `max_tokens`."""
        return (self.finish_reason == "length" and self.max_tokens is not None
                and len(self.token_times) < self.max_tokens)

    @property
    def is_completed(self) -> bool:
        """Finished normally (vllm bench serve's `success`)."""
        return self.finish_reason is not None and self.finish_reason not in ABORTED_REASONS


def records_from_requests(reqs: Sequence[Request], delivery_delay: float = 0.0
                          ) -> list[RequestRecord]:
    """Each request's record; `delivery_delay` as `RequestRecord.from_request`'s."""
    return [RequestRecord.from_request(r, delivery_delay) for r in reqs]
