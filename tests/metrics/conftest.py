"""Shared fixtures for the metrics tests: a record factory."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from andante.core import SLO
from andante.metrics import RequestRecord
from tests.metrics.reference import MakeRecord


@pytest.fixture
def make_record() -> MakeRecord:
    counter = iter(range(1_000_000))

    def make(
        arrival: float = 0.0,
        times: Sequence[float] = (),
        finish_reason: str | None = "stop",
        slo: SLO | None = None,
        num_prompt_tokens: int = 10,
        num_preemptions: int = 0,
        max_tokens: int | None = None,
    ) -> RequestRecord:
        return RequestRecord(
            request_id=f"r{next(counter)}",
            arrival_time=arrival,
            token_times=tuple(times),
            num_prompt_tokens=num_prompt_tokens,
            slo=slo if slo is not None else SLO(),
            finish_reason=finish_reason,
            num_preemptions=num_preemptions,
            max_tokens=max_tokens,
        )

    return make
