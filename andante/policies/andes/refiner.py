"""The overhead-aware refiner of `andes` (Andes §4.3) and its preemption mechanism.

Design note (Andes §4.3 "Overhead-aware refinement"). The knapsack (§4.2) and the
ordering between solves propose admissions and victims; pausing a running request
costs it a swap round trip or a recompute, and stalls the kept streams while the
admitted prompts prefill. So admission/preemption pairs (`pair_up`) are kept only while
their gain exceeds that cost (`accepted_prefix`): the victims' lost gain plus their
round trip, and L(O), what the kept streams lose if their next token comes O seconds
late, within a slack budget (a low percentile of the running requests' slack). Each
victim is preempted by the cheaper of swap and recompute, as the host tier fills
(`_modes`, `mode_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from andante.core.request import PreemptionMode, Request
from andante.engine.plan import StepPlan
from andante.policies.andes.knapsack import LatencyModel, View
from andante.policies.andes.options import AndesOptions
from andante.policies.andes.qoe import objective_gain, qoe_at


class OverheadRefiner:
    """§4.3 over a decision's view (see the module note). `refine_admissions`: weigh
    admissions that preempt nobody too (`AndesOptions.refine_admissions`)."""

    def __init__(self, options: AndesOptions, latency: LatencyModel,
                 refine_admissions: bool) -> None:
        self.options = options
        self.latency = latency
        self.refine_admissions = refine_admissions

    def refine(self, plan: StepPlan, view: View, admits: np.ndarray, victims: np.ndarray,
               gain: np.ndarray, tau: float, starved: np.ndarray | None = None,
               budget: float | None = None) -> tuple[list[Request], list[Request]]:
        """§4.3 over view positions (admissions best first, victims worst first);
        `starved` as `knapsack.starvation` gives it; `budget`: `slack_budget` if known."""
        o = self.options
        if budget is None:
            budget = self.slack_budget(plan, view)
        if budget <= 0.0:
            victims = victims[:0]  # no slack to spend: admit only into free memory
        elif o.max_preemptions is not None:
            victims = victims[: o.max_preemptions]
        reqs = view.reqs
        victim_reqs = [reqs[i] for i in victims]
        pairs = pair_up(view.weight[admits].tolist(),
                        [plan.num_blocks_of(v) for v in victim_reqs],
                        plan.num_free_blocks_above_watermark)
        keep = len(pairs)
        if o.refiner and pairs and (self.refine_admissions or any(p.victims for p in pairs)):
            # only the victims some pair needs are weighed (`_modes` fills the host
            # tier in victim order, so a prefix of them gets the same modes)
            paired = victims[:max((v + 1 for p in pairs for v in p.victims), default=0)]
            round_trip = self._round_trips(plan, victim_reqs[:len(paired)],
                                           plan.num_slots_in(view.weight[paired]))
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

    def slack_budget(self, plan: StepPlan, view: View) -> float:
        """Seconds of overhead the ongoing requests tolerate (a low slack percentile;
        unbounded without the refiner)."""
        if not self.options.refiner:
            return float("inf")
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

    def mode_for(self, plan: StepPlan, req: Request) -> PreemptionMode:
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


# Design note (Andes §4.3, Fig. 9). Admissions are visited from the highest priority;
# each is paired with the lowest-priority victims that barely make room for it (none
# if memory is free). The pair's overhead is the admission's prefill (new or recompute)
# or swap-in plus the victims' swap-outs (a recompute preemption costs nothing now; it
# pays its prefill when it resumes). Overheads accumulate: after k pairs, every kept
# running request has stalled O_k seconds, and its QoE loss is computed like Q_wait —
# its predicted QoE over Δt served from now minus the same prediction with its next
# token O_k later. Pair k is kept if its net gain (its gain minus its victims' gains)
# exceeds the loss increment L(O_k) - L(O_{k-1}); at the first pair that does not pay,
# it and every later pair are cancelled. Pairs without victims are weighed the same way
# when `check_all` (the policy's `refine_admissions`), otherwise always kept; either
# way their overhead counts for later pairs.
# Preemption budget (Andes' public code): the cumulative overhead of pairs with victims
# may not exceed the slack of the ongoing requests at a low percentile (10 %) — the time
# before their QoE starts to degrade; under overload, when queued requests are already
# late, this stops preemptions that the myopic Δt gains would allow (the normalizer of
# QoE makes long streams look nearly free to pause, while each resumption costs a
# prefill that the whole backlog pays for).
# L is evaluated exactly at up to `MAX_EXACT` points, otherwise interpolated on a grid
# (it is monotone in O), so the refiner stays O(R) numpy work per decision.
MAX_EXACT = 32


@dataclass(slots=True)
class Pair:
    admit: int  # index of the admission among the candidates
    victims: list[int] = field(default_factory=list)  # indices among the victims


def pair_up(admit_blocks: Sequence[int], victim_blocks: Sequence[int],
            free_blocks: int) -> list[Pair]:
    """Pair each admission (in order) with the next victims needed to make room;
    stops at the first admission that cannot fit even with every victim."""
    pairs: list[Pair] = []
    free = free_blocks
    next_victim = 0
    for a, need in enumerate(admit_blocks):
        pair = Pair(a)
        while free < need and next_victim < len(victim_blocks):
            free += victim_blocks[next_victim]
            pair.victims.append(next_victim)
            next_victim += 1
        if free < need:
            break
        free -= need
        pairs.append(pair)
    return pairs


def _losses(loss_at: Callable[[np.ndarray], np.ndarray], points: np.ndarray) -> np.ndarray:
    if len(points) <= MAX_EXACT:
        return loss_at(points)
    grid = np.linspace(0.0, float(points.max()), MAX_EXACT)
    return np.interp(points, grid, np.maximum.accumulate(loss_at(grid)))


def accepted_prefix(pairs: Sequence[Pair], admit_gain: np.ndarray, admit_cost: np.ndarray,
                    victim_gain: np.ndarray, victim_cost: np.ndarray,
                    loss_at: Callable[[np.ndarray], np.ndarray],
                    budget: float = np.inf, check_all: bool = False,
                    exempt: np.ndarray | None = None) -> int:
    """How many leading pairs the refiner keeps (see the module note); a pair with
    victims is also cancelled once the cumulative overhead would exceed `budget`.
    check_all: weigh admissions without victims too (else they are always kept), except
    those `exempt` marks (by admission index: starved requests)."""
    if not pairs:
        return 0
    admit = np.fromiter((p.admit for p in pairs), dtype=np.intp, count=len(pairs))
    with_victims = [k for k, p in enumerate(pairs) if p.victims]  # usually few
    cost = admit_cost[admit].astype(float)
    net = admit_gain[admit].astype(float)
    for k in with_victims:  # the same sums, in the same order, as pair by pair
        cost[k] = admit_cost[admit[k]] + sum(victim_cost[v] for v in pairs[k].victims)
        net[k] = admit_gain[admit[k]] - sum(victim_gain[v] for v in pairs[k].victims)
    after = np.cumsum(cost)
    before = after - cost
    has_victims = np.zeros(len(pairs), dtype=bool)
    has_victims[with_victims] = True
    weighed = has_victims.copy()
    if check_all:
        weighed |= True if exempt is None else ~exempt[admit].astype(bool)
    checked = np.flatnonzero(weighed)
    if not len(checked):
        return len(pairs)
    points = np.concatenate([before[checked], after[checked]])
    losses = _losses(loss_at, points)
    increments = losses[len(checked):] - losses[: len(checked)]
    fails = (has_victims[checked] & (after[checked] > budget)) | ~(net[checked] > increments)
    if fails.any():
        return int(checked[int(np.argmax(fails))])
    return len(pairs)
