"""One request of a workload, before it becomes an engine `Request`.

A `RequestSpec` is plain, immutable data (when it arrives, how long its prompt and output
are, its objectives); `to_request` turns it into a simulation `Request` whose prompt is a
`SyntheticTokens` of the right length and whose output runs to exactly `output_len`
tokens (`ignore_eos`), so a simulated run generates what the workload prescribes; its
`prefix` (content ids, `andante.workload.prefix`) lets the prefix cache share blocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from andante.core.request import PrefixIds, Request, SyntheticTokens
from andante.core.sampling import SLO, SamplingParams


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """arrival_time: seconds from the workload's start (>= 0); lengths in tokens (>= 1)."""

    arrival_time: float
    prompt_len: int
    output_len: int
    slo: SLO = SLO()
    priority: int = 0
    model: str = ""
    prefix: PrefixIds | None = None  # content ids of the prompt (prefix caching)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_time) and self.arrival_time >= 0):
            raise ValueError(f"arrival_time must be finite and >= 0, got {self.arrival_time!r}")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len!r}")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len!r}")


def to_request(
    spec: RequestSpec,
    request_id: str,
    *,
    time_offset: float = 0.0,
    token_id: int = 0,
    sampling: SamplingParams | None = None,
) -> Request:
    """A simulation request: synthetic prompt, exactly `output_len` tokens of output.

    time_offset: added to the arrival time (the clock time at which the workload starts).
    sampling: replaces the default `SamplingParams(max_tokens=output_len, ignore_eos=True)`.
    """
    params = sampling or SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
    return Request(
        request_id=request_id,
        prompt_token_ids=SyntheticTokens(spec.prompt_len, token_id),
        sampling=params,
        arrival_time=spec.arrival_time + time_offset,
        priority=spec.priority,
        model=spec.model,
        slo=spec.slo,
        prefix_ids=spec.prefix,
    )


def to_requests(
    specs: Iterable[RequestSpec], *, prefix: str = "req-", time_offset: float = 0.0
) -> list[Request]:
    """`to_request` for each spec, with ids `prefix + index` in order."""
    return [
        to_request(spec, f"{prefix}{index}", time_offset=time_offset)
        for index, spec in enumerate(specs)
    ]
