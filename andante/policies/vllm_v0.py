"""`vllm-v0`: vLLM v0's prefill-first scheduling, under FCFS or any static order.

Design note: vLLM v0's default scheduler (vllm/core/scheduler.py, `_schedule_default`;
see `phases`), the baseline the Andes, FastServe and Ascendra papers compared against:
a step runs new prefills if any fit (head-of-line: the first that does not fit stops
admission, and nothing is admitted while requests are swapped out); otherwise it decodes
every running request, preempting the most recently admitted when blocks run out;
swapped requests come back only in a step that preempted nobody. `OrderedPolicy`
generalizes it to any static order (`priority`, `edf`, `sjf`), plus v0's priority mode
(`_schedule_priority_preemption`): when the best waiting request does not fit, running
requests strictly worse than it are preempted from the back until it does. Sort keys are
computed once per request and the waiting queue is re-sorted only after arrivals or
preemptions, so a decision stays cheap with 10^4 waiting.
"""

from __future__ import annotations

from typing import Any, ClassVar

from andante.core.request import Request
from andante.engine.fast_path import FastPathDefaults
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy, PolicyContext
from andante.policies.phases import (
    admit_in_order,
    preempt_for,
    prefill_first_step,
)


class OrderedPolicy(BasePolicy, FastPathDefaults):
    name = "ordered"
    preempts_for_waiting: ClassVar[bool] = False  # may arrivals preempt worse running ones?
    sorts_running: ClassVar[bool] = False  # else admission order: the newest is the victim
    stationary = True  # static keys: same queues and blocks, same decision

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._keys: dict[Request, Any] = {}
        self._waiting_sorted = True
        self._tail_key: Any = None  # no waiting key since the last sort is above it

    def sort_key(self, req: Request) -> Any:
        raise NotImplementedError

    @property
    def decode_budget(self) -> int:
        """With nothing waiting, every running request decodes, in the running order
        unless it is sorted (andante.sim.after_finish)."""
        return 0 if self.sorts_running else self.ctx.config.max_num_batched_tokens

    def on_arrival(self, req: Request) -> None:
        """The scheduler appends `req` to the waiting queue: it stays sorted while the
        arrivals' keys do not decrease (arrival order, deadlines of one SLO), so a long
        queue is not sorted again at every arrival."""
        key = self._keys[req] = self.sort_key(req)
        if self._tail_key is not None and key < self._tail_key:
            self._waiting_sorted = False
        else:
            self._tail_key = key

    def on_finish(self, req: Request) -> None:
        self._keys.pop(req, None)

    def schedule(self, plan: StepPlan) -> None:
        self._order(plan)
        prefill_first_step(plan, self._admit)
        if plan.preemptions:
            self._waiting_sorted = False  # recomputed requests went to the front

    def _key(self, req: Request) -> Any:
        key = self._keys.get(req)
        if key is None:
            key = self._keys[req] = self.sort_key(req)
        return key

    def _order(self, plan: StepPlan) -> None:
        if not self._waiting_sorted:
            plan.waiting.sort(key=self._key)
            self._waiting_sorted = True
            self._tail_key = self._key(plan.waiting[-1]) if plan.waiting else None
        if self.sorts_running:
            plan.running.sort(key=self._key)

    def _admit(self, plan: StepPlan) -> None:
        if not self.preempts_for_waiting:
            admit_in_order(plan, plan.waiting)
            return
        key = self._key
        for req in plan.waiting:
            n = req.num_uncomputed_tokens
            if plan.has_seq_room and plan.can_schedule(req, n):
                plan.schedule(req, n)
                continue
            req_key = key(req)
            worse = [r for r in reversed(plan.running) if key(r) > req_key]
            if not preempt_for(plan, req, worse):
                return
            plan.schedule(req, n)


class VLLMV0Policy(OrderedPolicy):
    name = "vllm-v0"

    def sort_key(self, req: Request) -> float:
        return req.arrival_time
