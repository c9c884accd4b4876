"""`edf`: earliest deadline first, preemptive.

Design note: classic EDF (Liu & Layland, 1973) at token granularity. A request's
deadline is arrival + its end-to-end `deadline` SLO; without one, arrival + its TTFT
SLO; without either it sorts after every request that has one, in arrival order.
"""

from __future__ import annotations

import math

from andante.core.request import Request
from andante.policies.vllm_v0 import OrderedPolicy


def absolute_deadline(req: Request) -> float:
    slo = req.slo
    budget = slo.deadline if slo.deadline is not None else slo.ttft
    return math.inf if budget is None else req.arrival_time + budget


class EDFPolicy(OrderedPolicy):
    name = "edf"
    preempts_for_waiting = True
    sorts_running = True

    def sort_key(self, req: Request) -> tuple[float, float]:
        return (absolute_deadline(req), req.arrival_time)
