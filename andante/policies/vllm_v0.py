"""`vllm-v0`: first-come-first-served, prefill-first, recompute the newest on shortage.

Design note: vLLM v0's default scheduler (vllm/core/scheduler.py, `_schedule_default`;
see `phases`), the baseline the Andes and FastServe papers compared against. A step
runs new prefills if any fit (FCFS, head-of-line: the first that does not fit stops
admission, and nothing is admitted while requests are swapped out); otherwise it decodes
every running request, preempting the most recently admitted when blocks run out;
swapped requests come back only in a step that preempted nobody.
"""

from __future__ import annotations

from andante.core.request import Request
from andante.policies.ordered import OrderedPolicy


class VLLMV0Policy(OrderedPolicy):
    name = "vllm-v0"

    def sort_key(self, req: Request) -> float:
        return req.arrival_time
