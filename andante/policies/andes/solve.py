"""The triggered decision: Eq. 5 over candidate batch sizes, then the refiner.

Design note (Andes §4.1-§4.3). The knapsack capacity M is what the running requests
hold plus the free blocks, less the admission watermark. For every candidate B
(`batch_range`/`batch_candidates`, §4.2 pruning) the item values are the objective's
gains with τ(B) (Appendix B) — one broadcast (K, N) evaluation — and the greedy
(Alg. 1) or the DP (Appendix C) packs them; the B with the largest total gain wins
(ties: the larger B). Chosen queued requests become admissions in priority order,
unchosen running requests candidate victims from the lowest priority up, and the
refiner keeps the pairs worth their overhead. Without the refiner every unchosen
running request is preempted, as the knapsack decided. With it, an unchosen running
request that no kept admission needs the memory of keeps running: pausing it to shrink
the batch would hold its KV and its sequence slot while serving nobody.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from andante.engine.plan import StepPlan
from andante.policies.andes.decision import Decision
from andante.policies.andes.knapsack import (
    Packing,
    batch_candidates,
    batch_range,
    dp_pack,
    fill,
    greedy_pack,
)
from andante.policies.andes.view import RUNNING, View

if TYPE_CHECKING:
    from andante.policies.andes.policy import AndesPolicy


def _batches(policy: AndesPolicy, plan: StepPlan, view: View,
             capacity: float) -> tuple[np.ndarray, int]:
    o = policy.options
    max_seqs = plan.config.max_num_seqs
    fast = max_seqs
    if o.batch_search:
        fast = policy.latency.fastest_batch_within(float(view.streams.inv.min()))
    b_min, b_max = batch_range(view.weight, capacity, max_seqs, fast)
    if not o.batch_search:
        return np.array([b_max], dtype=np.intp), b_max
    return batch_candidates(b_min, b_max, o.max_batch_candidates), b_max


def _pack(policy: AndesPolicy, view: View, gain: np.ndarray, capacity: float,
          batch: int) -> Packing:
    o = policy.options
    prio = policy.priority(gain, view.weight, view.kind)
    if o.solver == "dp":
        packing = dp_pack(prio, gain, view.weight, capacity, batch, o.dp_max_items,
                          o.dp_capacity_units)
        return fill(packing, prio, view.weight, capacity)
    return greedy_pack(prio, gain, view.weight, capacity, batch)


def solve_knapsack(policy: AndesPolicy, plan: StepPlan, view: View) -> Decision:
    nr = view.num_running
    reserve = int(plan.config.watermark * plan.num_total_blocks)
    capacity = plan.num_free_blocks + float(view.weight[:nr].sum()) - reserve
    batches, b_max = _batches(policy, plan, view, capacity)
    if len(batches) == 0:
        return Decision(decode_order=list(view.reqs[:nr]))
    tau = policy.latency.tau(batches)[:, None]
    gains = policy.gain(view.streams, plan.now, view.first_delay(tau), tau, view)
    best: Packing | None = None
    best_k = 0
    for k, batch in enumerate(batches):
        packing = _pack(policy, view, gains[k], capacity, int(batch))
        if best is None or packing.value >= best.value:
            best, best_k = packing, k
    assert best is not None
    return _decide(policy, plan, view, best, gains[best_k], float(tau[best_k, 0]), b_max)


def _decide(policy: AndesPolicy, plan: StepPlan, view: View, best: Packing,
            gain: np.ndarray, tau: float, b_max: int) -> Decision:
    nr = view.num_running
    prio = policy.priority(gain, view.weight, view.kind)
    chosen = best.chosen
    selected = np.zeros(len(view), dtype=bool)
    selected[chosen] = True
    admits = chosen[view.kind[chosen] != RUNNING]
    dropped = np.flatnonzero(~selected[:nr])
    victims = dropped[np.argsort(prio[dropped], kind="stable")]
    admit_reqs, victim_reqs = policy.refine(plan, view, admits, victims, gain, tau)
    if not policy.options.refiner:  # the knapsack's decision as it is
        cap = policy.options.max_preemptions
        victim_reqs = [view.reqs[i] for i in (victims if cap is None else victims[:cap])]
    decode = np.argsort(-prio[:nr], kind="stable")
    return Decision(admit_reqs, victim_reqs, [view.reqs[i] for i in decode])
