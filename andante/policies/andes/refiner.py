"""The overhead-aware refiner of `andes` (Andes §4.3) and its preemption mechanism.

Design note (Andes §4.3 "Overhead-aware refinement"). The knapsack (§4.2) and the
ordering between solves propose admissions and victims; pausing a running request
costs it a swap round trip or a recompute, and stalls the kept streams while the
admitted prompts prefill. So admission/preemption pairs (`solver.pair_up`) are kept
only while their gain exceeds that cost (`solver.accepted_prefix`): the victims' lost
gain plus their round trip, and L(O), what the kept streams lose if their next token
comes O seconds late, within a slack budget (a low percentile of the running requests'
slack). Each victim is preempted by the cheaper of swap and recompute, as the host tier
fills (`_modes`).

`OverheadRefiner` is a mixin of `AndesPolicy` (policy.py): it reads the policy's
options and latency model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from andante.core.request import PreemptionMode, Request
from andante.engine.plan import StepPlan
from andante.policies.andes.gain import objective_gain, qoe_at
from andante.policies.andes.solver import View, accepted_prefix, pair_up

if TYPE_CHECKING:
    from andante.policies.andes.latency import LatencyModel
    from andante.policies.andes.options import AndesOptions


class OverheadRefiner:
    """§4.3 for `AndesPolicy` (see the module note)."""

    if TYPE_CHECKING:  # the policy's state the refiner reads (policy.py)
        options: AndesOptions
        latency: LatencyModel
        refine_admissions: bool

    def refine(self, plan: StepPlan, view: View, admits: np.ndarray, victims: np.ndarray,
               gain: np.ndarray, tau: float, starved: np.ndarray | None = None,
               ) -> tuple[list[Request], list[Request]]:
        """§4.3 over view positions (admissions best first, victims worst first);
        `starved` as `self.starved(view, plan.now)` gives it."""
        o = self.options
        budget = self._slack_budget(plan, view) if o.refiner else float("inf")
        if budget <= 0.0:
            victims = victims[:0]  # no slack to spend: admit only into free memory
        elif o.max_preemptions is not None:
            victims = victims[: o.max_preemptions]
        reqs = view.reqs
        victim_reqs = [reqs[i] for i in victims]
        pairs = pair_up(view.weight[admits].tolist(),
                        [plan.num_blocks_of(v) for v in victim_reqs],
                        plan.num_free_blocks - plan.watermark_blocks)
        keep = len(pairs)
        if o.refiner and pairs and (self.refine_admissions or any(p.victims for p in pairs)):
            # only the victims some pair needs are weighed (`_modes` fills the host
            # tier in victim order, so a prefix of them gets the same modes)
            paired = victims[:max((v + 1 for p in pairs for v in p.victims), default=0)]
            round_trip = self._round_trips(plan, victim_reqs[:len(paired)],
                                           view.weight[paired] * plan.block_size)
            keep = accepted_prefix(pairs, gain[admits], view.base[admits], gain[paired],
                                   round_trip, self._loss_fn(plan, view, victims, tau),
                                   budget, check_all=self.refine_admissions,
                                   exempt=None if starved is None else starved[admits] > 0)
        kept = pairs[:keep]
        return ([reqs[admits[p.admit]] for p in kept],
                [victim_reqs[v] for p in kept for v in p.victims])

    def _round_trips(self, plan: StepPlan, victims: list[Request],
                     tokens: np.ndarray) -> np.ndarray:
        """Seconds each of `victims` (holding `tokens`) costs to preempt and resume
        (swap out and in, or a recompute), by the mechanism `_modes` picks."""
        if not victims:
            return np.zeros(0)
        modes = self._modes(plan, victims)
        swapped = np.array([m == PreemptionMode.SWAP for m in modes], dtype=bool)
        return np.where(swapped, 2.0 * self.latency.swap_time(tokens),
                        self.latency.prefill_time(tokens))

    def _modes(self, plan: StepPlan, victims: list[Request]) -> list[PreemptionMode]:
        """Modes for preempting `victims` in order, as the host tier fills up."""
        host = plan.num_free_host_blocks
        modes = []
        for v in victims:
            blocks = plan.num_blocks_of(v)
            mode = self._cheaper_mode(v, blocks <= host)
            if mode == PreemptionMode.SWAP:
                host -= blocks
            modes.append(mode)
        return modes

    def _slack_budget(self, plan: StepPlan, view: View) -> float:
        """Seconds of overhead the ongoing requests tolerate (a low slack percentile)."""
        q = self.options.slack_percentile
        if q >= 1.0:
            return float("inf")
        s = view.streams
        slack = s.start + s.n * s.inv + np.maximum(s.late, 0.0) - plan.now
        k = min(len(slack) - 1, int(q * len(slack)))
        return float(np.partition(slack, k)[k])

    def _loss_fn(self, plan: StepPlan, view: View, victims: np.ndarray,
                 tau: float) -> Callable[[np.ndarray], np.ndarray]:
        """L(O): what the kept running requests lose over Δt, in the objective's units
        (times `stall_weight`), if their next token comes O seconds late.

        A stream generated at least as fast as it is read (τ <= 1/tds) whose reader
        needs its next token later than τ + O loses nothing, so only the others are
        evaluated."""
        keep = np.ones(view.num_running, dtype=bool)
        keep[victims[victims < view.num_running]] = False
        s = view.streams.select(np.flatnonzero(keep))
        now, t = plan.now, plan.now + self.options.delta_t
        slack = s.start + s.n * s.inv + np.maximum(s.late, 0.0) - now
        fast = tau <= s.inv
        objective, weight = self.options.objective, self.options.stall_weight
        q_min = float(qoe_at(view.streams, now, now).min()) if objective == "min" else 1.0

        def loss_at(stall: np.ndarray) -> np.ndarray:
            risk = np.flatnonzero((slack < tau + float(stall.max())) | ~fast)
            if not len(risk):
                return np.zeros(len(stall))
            sub = s.select(risk)
            firsts = tau + np.concatenate(([0.0], stall))[:, None]  # on time, then late
            q = qoe_at(sub, now, t, firsts, tau)
            on_time, late = q[0], q[1:]
            q_now = qoe_at(sub, now, now) if objective == "perfect" else on_time
            lost = objective_gain(objective, on_time, late, q_now, q_min)
            return np.asarray(weight * lost.sum(axis=1))

        return loss_at

    def _mode_for(self, plan: StepPlan, req: Request) -> PreemptionMode:
        """The cheaper of swap and recompute (§4.3), as the options allow."""
        return self._cheaper_mode(req, plan.can_preempt(req, PreemptionMode.SWAP))

    def _cheaper_mode(self, req: Request, can_swap: bool) -> PreemptionMode:
        choice = self.options.preemption
        if choice == "recompute" or not can_swap:
            return PreemptionMode.RECOMPUTE
        if choice == "swap":
            return PreemptionMode.SWAP
        swap = 2.0 * float(self.latency.swap_time(np.array(req.num_computed_tokens)))
        recompute = float(self.latency.prefill_time(np.array(req.num_tokens)))
        return PreemptionMode.SWAP if swap < recompute else PreemptionMode.RECOMPUTE

