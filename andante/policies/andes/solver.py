"""The arrays of one decision, Andes' knapsack solvers and the refiner's bookkeeping.

Design note (Andes §4.2, Eq. 5). The knapsack serves a set of requests of total
context <= M and size <= B that maximizes the summed QoE gain. `greedy_pack` is
Algorithm 1: sort by priority (gain per KV block, Eq. 6) and take requests until the
next one does not fit in memory or the batch is full (it stops there, as the
algorithm's `break`). Only the top B priorities can be taken, so an O(N) partition
finds them before an O(B log B) sort. `batch_range` is §4.2's pruning: B_max adds the
shortest contexts until M is reached; B_min is the largest B whose token latency still
beats the most stringent reader (smaller batches only waste speed), so [B_min, B_max]
is searched, at most `max_candidates` evenly spread values of it. `dp_pack` is
Appendix C's 3-D dynamic programme over (request, batch size, memory), here "at most B"
requests, numpy-vectorized over (b, m); it is exact when M <= `units` and N <=
`max_items`, otherwise memory is rounded up to M/units-block units and only the
`max_items` best-priority requests are considered.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from andante.core.request import Request
from andante.engine.plan import StepPlan
from andante.policies.andes.gain import RequestTable, Streams
from andante.policies.andes.latency import LatencyModel

RUNNING, WAITING, SWAPPED = 0, 1, 2


@dataclass(slots=True)
class View:
    """reqs[i] has state streams[i], kind[i], weight[i] (KV blocks with room for the
    next token) and first-token delay base[i] + step[i]·τ if served."""

    reqs: list[Request]
    num_running: int
    idx: np.ndarray
    streams: Streams
    kind: np.ndarray
    weight: np.ndarray
    base: np.ndarray
    step: np.ndarray

    @classmethod
    def of(cls, table: RequestTable, plan: StepPlan, latency: LatencyModel) -> View:
        reqs = [*plan.running, *plan.waiting, *plan.swapped]
        nr, nw = len(plan.running), len(plan.waiting)
        idx = table.indices(reqs)
        kind = np.full(len(reqs), WAITING, dtype=np.int8)
        kind[:nr] = RUNNING
        kind[nr + nw:] = SWAPPED
        *fields, prompt = table.state.take(idx, axis=1)  # (one gather)
        streams = Streams(*fields)
        tokens = prompt + streams.n
        weight = np.ceil((tokens + 1.0) / plan.block_size)
        base = np.zeros(len(reqs))
        if nw:
            base[nr:nr + nw] = latency.prefill_time(tokens[nr:nr + nw])
        if len(reqs) > nr + nw:
            base[nr + nw:] = latency.swap_time(tokens[nr + nw:])
        step = (kind != WAITING).astype(float)
        return cls(reqs, nr, idx, streams, kind, weight, base, step)

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def queued(self) -> slice:
        """Waiting and swapped requests."""
        return slice(self.num_running, len(self.reqs))

    def first_delay(self, tau: np.ndarray) -> np.ndarray:
        """Delay of each request's next token if served at per-token latency `tau`
        (broadcasts: tau of shape (K, 1) gives (K, N))."""
        return self.base + self.step * tau


@dataclass(slots=True)
class Packing:
    value: float
    chosen: np.ndarray  # item indices, highest priority first
    batch: int  # the B it was solved for


def empty_packing(batch: int = 0) -> Packing:
    return Packing(0.0, np.empty(0, dtype=np.intp), batch)


SMALL_SORT = 32  # below this many elements a plain Python sort beats numpy's call overhead


def ascending(values: np.ndarray) -> list[int]:
    """Indices of `values` in ascending order, ties in index order (a stable argsort)."""
    if len(values) < SMALL_SORT:
        return sorted(range(len(values)), key=values.tolist().__getitem__)
    return np.argsort(values, kind="stable").tolist()


def top_order(prio: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest priorities, highest first (stable when k >= N)."""
    n = len(prio)
    k = min(k, n)
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    neg = -prio
    if k < n:
        top = np.argpartition(neg, k - 1)[:k]
        return top[np.argsort(neg[top], kind="stable")]
    return np.argsort(neg, kind="stable")


def greedy_pack(prio: np.ndarray, gain: np.ndarray, weight: np.ndarray,
                capacity: float, batch: int) -> Packing:
    """Algorithm 1: priority order, stop at the first request that does not fit."""
    order = top_order(prio, batch)
    if len(order) == 0:
        return empty_packing(batch)
    take = int(np.searchsorted(np.cumsum(weight[order]), capacity, side="right"))
    chosen = order[:take]
    return Packing(float(gain[chosen].sum()), chosen, batch)


def batch_range(weight: np.ndarray, capacity: float, max_seqs: int,
                fast_batch: int) -> tuple[int, int]:
    """(B_min, B_max) of §4.2's pruning; fast_batch = largest B fast enough for all."""
    k = min(len(weight), max_seqs)
    if k == 0:
        return 0, 0
    smallest = np.sort(np.partition(weight, k - 1)[:k]) if k < len(weight) else np.sort(weight)
    b_max = max(1, int(np.searchsorted(np.cumsum(smallest), capacity, side="right")))
    return min(max(fast_batch, 1), b_max), b_max


def batch_candidates(b_min: int, b_max: int, max_candidates: int) -> np.ndarray:
    if b_max <= 0:
        return np.empty(0, dtype=np.intp)
    if max_candidates == 0 or b_max - b_min + 1 <= max_candidates:
        return np.arange(b_min, b_max + 1, dtype=np.intp)
    return np.unique(np.linspace(b_min, b_max, max_candidates).round().astype(np.intp))


def dp_pack(prio: np.ndarray, gain: np.ndarray, weight: np.ndarray, capacity: float,
            batch: int, max_items: int = 256, units: int = 256) -> Packing:
    """Appendix C (at most `batch` items); see the module note for its bounds."""
    items = top_order(prio, max_items)
    unit = max(1, math.ceil(capacity / units)) if capacity > 0 else 1
    cap = int(capacity // unit)
    w = np.ceil(weight[items] / unit).astype(np.intp)
    q = gain[items]
    nb = min(batch, len(items))
    if nb <= 0 or cap < 0:
        return empty_packing(batch)
    dp = np.full((nb + 1, cap + 1), -np.inf)
    dp[0, 0] = 0.0
    choice = np.zeros((len(items), nb + 1, cap + 1), dtype=bool)
    for i in range(len(items)):
        wi = int(w[i])
        if wi > cap:
            continue
        cand = dp[:-1, : cap + 1 - wi] + q[i]
        cur = dp[1:, wi:]
        better = cand > cur
        choice[i, 1:, wi:] = better
        np.copyto(cur, cand, where=better)
    b, m = np.unravel_index(int(np.argmax(dp)), dp.shape)
    value = float(dp[b, m])
    picked: list[int] = []
    for i in range(len(items) - 1, -1, -1):
        if b > 0 and choice[i, b, m]:
            picked.append(int(items[i]))
            b -= 1
            m -= int(w[i])
    chosen = np.array(picked, dtype=np.intp)
    return Packing(value, chosen[np.argsort(-prio[chosen], kind="stable")], batch)


def fill(packing: Packing, prio: np.ndarray, weight: np.ndarray, capacity: float) -> Packing:
    """Add the remaining items in priority order while they fit (objective unchanged
    for zero-gain items; keeps running requests that cost nothing to keep)."""
    taken = np.zeros(len(prio), dtype=bool)
    taken[packing.chosen] = True
    used = float(weight[packing.chosen].sum())
    room = packing.batch - len(packing.chosen)
    extra: list[int] = []
    for i in top_order(np.where(taken, -np.inf, prio), len(prio)):
        if room <= 0 or taken[i]:
            break
        if used + weight[i] <= capacity:
            extra.append(int(i))
            used += float(weight[i])
            room -= 1
    if not extra:
        return packing
    chosen = np.concatenate([packing.chosen, np.array(extra, dtype=np.intp)])
    return Packing(packing.value, chosen, packing.batch)


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
    points = np.concatenate([before[checked], after[checked]])
    losses = _losses(loss_at, points)
    increments = losses[len(checked):] - losses[: len(checked)]
    for j, k in enumerate(checked):
        p = pairs[k]
        net = admit_gain[p.admit] - sum(victim_gain[v] for v in p.victims)
        if (p.victims and after[k] > budget) or not net > increments[j]:
            return k
    return len(pairs)
