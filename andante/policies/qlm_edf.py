"""`qlm-edf`: the engine policy behind QLM's agents (QLM §5, LSOs 1-3).

Design note. Under QLM the instance's engine does not pick what to preempt: its agent
(andante.cluster.qlm.agents) pulls requests from the head of the instance's virtual
queue and, when the head group changes, evicts or swaps out running requests to make
room for it (LSOs 2-3, applied by `Scheduler.request_preemption` before this policy
runs). The engine then serves what it holds earliest deadline first: running requests
advance in deadline order (preempting from the back on a block shortage, each victim
evicted or swapped by cost: `StepPlan.preemption_mode_for`); waiting and swapped-out
requests come in along one deadline order (`admit_and_swap_in`) with the token budget
the running ones left, in the same step (chunked prefill mixed with decodes, as the
`vllm` policy QLM is compared with). Unlike vLLM v0 (and the
`edf` policy, built on it), new requests are admitted while others are swapped out: a
state swap exists to make room for the head group, which must not wait for the swapped
requests to come back first. The policy never preempts a running request for a waiting
one by itself: that is the agent's eviction, so removing it (the ablation) removes
eviction altogether.
"""

from __future__ import annotations

from andante.engine.plan import StepPlan
from andante.policies.edf import EDFPolicy
from andante.policies.phases import admit_and_swap_in, advance_with_preemption, budgeted


class QLMEDFPolicy(EDFPolicy):
    name = "qlm-edf"
    preempts_for_waiting = False

    def schedule(self, plan: StepPlan) -> None:
        """Running requests advance first (deadline order), then waiting and swapped ones
        come in, chunked, with the step's token budget left: the mixed steps of the
        `vllm` policy QLM is compared with. (Prefill-only steps starved the running
        batch while the agents released arrivals a few at a time: on W_B at 16 req/s,
        20% latency-sensitive, an instance ran 12 prefill steps from 3.1 s to 6.4 s
        and every running request waited 5.7 s for its next token, where the `vllm`
        policy's longest gap was 0.78 s; with these steps, none is over 1 s. These
        steps first seemed to cost QLM 4-6% of its W_B throughput: the steps were not
        slower, at 32 req/s the two instances ran 50.5 s busy against 51.9 s, but one
        finished at 18.8 s and the other at 31.9 s, because the router's Θ measurement
        lost the seconds of load reports taken mid-step and the plan then put the whole
        queue on one instance: andante.cluster.qlm.speed.)"""
        self._order(plan)
        num_tokens = budgeted(plan)
        advance_with_preemption(plan, plan.running, num_tokens)
        if plan.preemptions:
            self._waiting_sorted = False  # recomputed requests went to the front
            return
        order = sorted([*plan.waiting, *plan.swapped], key=self._key) if plan.swapped \
            else plan.waiting
        admit_and_swap_in(plan, order, num_tokens)
