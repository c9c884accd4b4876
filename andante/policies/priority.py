"""`priority`: lower `priority` value first, ties by arrival; preempts lower priority.

Design note: vLLM's `--scheduling-policy priority` (v0 scheduler), with the
preemption of running lower-priority requests for a waiting higher-priority one.
"""

from __future__ import annotations

from andante.core.request import Request
from andante.policies.vllm_v0 import OrderedPolicy


class PriorityPolicy(OrderedPolicy):
    name = "priority"
    preempts_for_waiting = True
    sorts_running = True

    def sort_key(self, req: Request) -> tuple[int, float]:
        return (req.priority, req.arrival_time)
