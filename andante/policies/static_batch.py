"""`static-batch`: SHEPHERD-like static batches in deadline order (QLM's baseline).

Design note (QLM §8 baselines, after SHEPHERD, Zhang et al. NSDI 2023 §4-5, as QLM
describes it: "dynamic batching and an ILP formulation for ordering and placement ...
the LP formulation assumes fixed batches with deterministic execution times"). A batch
of at most `batch_size` requests is formed from the waiting queue in earliest-deadline
order (SHEPHERD's Flex scheduler serves the most urgent requests first) and runs until
every member has finished: nothing joins a batch in flight, which is what separates it
from continuous batching. When blocks run out the newest member is preempted (the
engine's recompute or swap), as in vLLM v0. The batch size adapts only through the KV
room (a batch stops at the first request that does not fit).
"""

from __future__ import annotations

from dataclasses import dataclass

from andante.core.request import Request
from andante.engine.plan import StepPlan
from andante.policies.edf import absolute_deadline
from andante.policies.phases import (
    admit_in_order,
    advance_with_preemption,
    remaining_tokens,
    swap_in_in_order,
)
from andante.policies.vllm_v0 import OrderedPolicy


@dataclass(frozen=True, slots=True)
class StaticBatchOptions:
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")


class StaticBatchPolicy(OrderedPolicy):
    name = "static-batch"
    Options = StaticBatchOptions

    def sort_key(self, req: Request) -> tuple[float, float]:
        return (absolute_deadline(req), req.arrival_time)

    def schedule(self, plan: StepPlan) -> None:
        self._order(plan)
        if not plan.running and not plan.swapped:  # the batch is done: form the next
            admit_in_order(plan, plan.waiting[:self.options.batch_size])
            return
        advance_with_preemption(plan, plan.running, remaining_tokens)
        if not plan.preemptions:
            swap_in_in_order(plan, plan.swapped)
        else:
            self._waiting_sorted = False
