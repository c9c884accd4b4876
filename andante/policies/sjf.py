"""`sjf`: shortest prompt first among waiting requests; running ones are not preempted.

Design note: non-preemptive shortest-job-first with the prompt length as the known
job size (output lengths are unknown to a real server).
"""

from __future__ import annotations

from andante.core.request import Request
from andante.policies.vllm_v0 import OrderedPolicy


class SJFPolicy(OrderedPolicy):
    name = "sjf"

    def sort_key(self, req: Request) -> tuple[int, float]:
        return (req.num_prompt_tokens, req.arrival_time)
