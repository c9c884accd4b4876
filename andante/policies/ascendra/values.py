"""Value functions of Ascendra's out-of-order batching: higher value runs first.

Design note (Ascendra §5.2): the LP instance orders its not-yet-prefilled requests by a
pluggable value function π(Φ, w) of the request and the performance model instead of
by arrival. EDF (the default) values a request by the inverse of its slack before its
TTFT deadline, 1 / (SLO − (wait + predicted prefill)), and infinitely once it can no
longer meet it; SJF prefers short predicted prefills, LJF long ones, FCFS old arrivals.
Operators may register their own (e.g. premium tenants first).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType

from andante.core.request import Request

# value(req, now, predicted prefill seconds, TTFT SLO seconds) -> value (higher first)
ValueFunction = Callable[[Request, float, float, float], float]


def edf(req: Request, now: float, prefill: float, ttft: float) -> float:
    slack = ttft - ((now - req.arrival_time) + prefill)
    return math.inf if slack <= 0 else 1.0 / slack


def sjf(req: Request, now: float, prefill: float, ttft: float) -> float:
    return math.inf if prefill <= 0 else 1.0 / prefill


def ljf(req: Request, now: float, prefill: float, ttft: float) -> float:
    return prefill


def fcfs(req: Request, now: float, prefill: float, ttft: float) -> float:
    return now - req.arrival_time


VALUE_FUNCTIONS: MappingProxyType[str, ValueFunction] = MappingProxyType({
    "edf": edf, "sjf": sjf, "ljf": ljf, "fcfs": fcfs,
})


def value_function(name: str) -> ValueFunction:
    try:
        return VALUE_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown value function {name!r}; choose one of "
                         f"{', '.join(sorted(VALUE_FUNCTIONS))}") from None
