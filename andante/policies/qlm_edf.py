"""`qlm-edf`: the engine policy behind QLM's agents (QLM §5, LSOs 1-3).

Design note. Under QLM the instance's engine does not pick what to preempt: its agent
(andante.cluster.qlm.agents) pulls requests from the head of the instance's virtual
queue and, when the head group changes, evicts or swaps out running requests to make
room for it (LSOs 2-3, applied by `Scheduler.request_preemption` before this policy
runs). The engine then serves what it holds earliest deadline first: running requests
advance in deadline order (preempting from the back on a block shortage, each victim
evicted or swapped by cost: `StepPlan.preemption_mode_for`); waiting and swapped-out
requests come in along one deadline order (`admit_and_swap_in`). Unlike vLLM v0 (and the
`edf` policy, built on it), new requests are admitted while others are swapped out: a
state swap exists to make room for the head group, which must not wait for the swapped
requests to come back first. The policy never preempts a running request for a waiting
one by itself: that is the agent's eviction, so removing it (the ablation) removes
eviction altogether.
"""

from __future__ import annotations

from andante.engine.plan import StepPlan
from andante.policies.edf import EDFPolicy
from andante.policies.phases import admit_and_swap_in, advance_with_preemption, remaining_tokens


class QLMEDFPolicy(EDFPolicy):
    name = "qlm-edf"
    preempts_for_waiting = False

    def schedule(self, plan: StepPlan) -> None:
        self._order(plan)
        key = self._key
        if plan.swapped:
            order = sorted([*plan.waiting, *plan.swapped], key=key)
            prefilled = admit_and_swap_in(plan, order)
        else:
            prefilled = self._admit_waiting(plan)
        if not prefilled:
            advance_with_preemption(plan, plan.running, remaining_tokens)
        if plan.preemptions:
            self._waiting_sorted = False  # recomputed requests went to the front

    def _admit_waiting(self, plan: StepPlan) -> bool:
        before = len(plan.scheduled)
        self._admit(plan)
        return len(plan.scheduled) > before
