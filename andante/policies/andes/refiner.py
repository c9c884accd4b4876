"""Overhead-aware refiner: keep an admission (and its preemptions) only if it gains
more QoE than the stall it causes costs the requests that keep running.

Design note (Andes §4.3, Fig. 9). Admissions are visited from the highest priority;
each is paired with the lowest-priority victims that barely make room for it (none
if memory is free). The pair's overhead is the admission's prefill (new or recompute)
or swap-in plus the victims' swap-outs (a recompute preemption costs nothing now; it
pays its prefill when it resumes). Overheads accumulate: after k pairs, every kept
running request has stalled O_k seconds, and its QoE loss is computed like Q_wait —
its predicted QoE over Δt served from now minus the same prediction with its next
token O_k later. Pair k is kept if its net gain (its gain minus its victims' gains)
exceeds the loss increment L(O_k) - L(O_{k-1}); at the first pair that does not pay,
it and every later pair are cancelled. Pairs without victims are always kept (their
prefill is unavoidable work) but their overhead still counts for later pairs.
Preemption budget (Andes' public code): the cumulative overhead of pairs with victims
may not exceed the slack of the ongoing requests at a low percentile (10 %) — the time
before their QoE starts to degrade; under overload, when queued requests are already
late, this stops preemptions that the myopic Δt gains would allow (the normalizer of
QoE makes long streams look nearly free to pause, while each resumption costs a
prefill that the whole backlog pays for).
L is evaluated exactly at up to `MAX_EXACT` points, otherwise interpolated on a grid
(it is monotone in O), so the refiner stays O(R) numpy work per decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

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
                    budget: float = np.inf, check_all: bool = False) -> int:
    """How many leading pairs the refiner keeps (see the module note); a pair with
    victims is also cancelled once the cumulative overhead would exceed `budget`.
    check_all: weigh admissions without victims too (else they are always kept)."""
    if not pairs:
        return 0
    cost = np.array([admit_cost[p.admit] + sum(victim_cost[v] for v in p.victims)
                     for p in pairs])
    after = np.cumsum(cost)
    before = after - cost
    checked = [k for k, p in enumerate(pairs) if p.victims or check_all]
    if not checked:
        return len(pairs)
    points = np.concatenate([before[checked], after[checked]])
    losses = _losses(loss_at, points)
    increments = losses[len(checked):] - losses[: len(checked)]
    for j, k in enumerate(checked):
        p = pairs[k]
        net = admit_gain[p.admit] - sum(victim_gain[v] for v in p.victims)
        if (p.victims and after[k] > budget) or not net > increments[j]:
            return k
    return len(pairs)
