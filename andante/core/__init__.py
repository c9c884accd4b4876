"""Core types shared by every layer: requests, sampling parameters, SLOs, clocks."""

from andante.core.clock import Clock, ManualClock, MonotonicClock
from andante.core.request import (
    PreemptionMode,
    Request,
    RequestStatus,
    SyntheticTokens,
    Timeline,
)
from andante.core.sampling import SLO, SamplingParams

__all__ = [
    "SLO",
    "Clock",
    "ManualClock",
    "MonotonicClock",
    "PreemptionMode",
    "Request",
    "RequestStatus",
    "SamplingParams",
    "SyntheticTokens",
    "Timeline",
]
