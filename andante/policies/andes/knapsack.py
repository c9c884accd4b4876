"""Solvers for Andes' knapsack (Eq. 5): serve a set of requests of total context
<= M and size <= B that maximizes the summed QoE gain.

Design note. `greedy_pack` is Algorithm 1 (§4.2): sort by priority (gain per KV block,
Eq. 6) and take requests until the next one does not fit in memory or the batch is
full (it stops there, as the algorithm's `break`). Only the top B priorities can be
taken, so an O(N) partition finds them before an O(B log B) sort. `batch_range` is
§4.2's pruning: B_max adds the shortest contexts until M is reached; B_min is the
largest B whose token latency still beats the most stringent reader (smaller batches
only waste speed), so [B_min, B_max] is searched, at most `max_candidates` evenly
spread values of it. `dp_pack` is Appendix C's 3-D dynamic programme over (request,
batch size, memory), here "at most B" requests, numpy-vectorized over (b, m); it is
exact when M <= `units` and N <= `max_items`, otherwise memory is rounded up to
M/units-block units and only the `max_items` best-priority requests are considered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class Packing:
    value: float
    chosen: np.ndarray  # item indices, highest priority first
    batch: int  # the B it was solved for


def empty_packing(batch: int = 0) -> Packing:
    return Packing(0.0, np.empty(0, dtype=np.intp), batch)


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
