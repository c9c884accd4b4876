"""The knapsack of one `andes` decision (Andes §4.2, Eq. 5-6, Algorithm 1, Appendix
B-C): the decision's arrays, the candidate batch sizes and their token latency, and the
solvers.

Design note (Andes §4.2, Eq. 5). The knapsack serves a set of requests of total
context <= M and size <= B that maximizes the summed QoE gain (`qoe.qoe_gain`, each
request's next token after its first-token delay, the following every τ(B)). `solve`
tries each candidate B and keeps the best. `greedy_pack` is Algorithm 1: sort by
priority (gain per KV block, Eq. 6, `priority`) and take requests until the next one
does not fit in memory or the batch is full (it stops there, as the algorithm's
`break`). Only the top B priorities can be taken, so an O(N) partition finds them
before an O(B log B) sort. `batch_range` is §4.2's pruning: B_max adds the shortest
contexts until M is reached; B_min is the largest B whose token latency still beats the
most stringent reader (smaller batches only waste speed), so [B_min, B_max] is
searched, at most `max_candidates` evenly spread values of it. `dp_pack` is Appendix
C's 3-D dynamic programme over (request, batch size, memory), here "at most B"
requests, numpy-vectorized over (b, m); it is exact when M <= `units` and N <=
`max_items`, otherwise memory is rounded up to M/units-block units and only the
`max_items` best-priority requests are considered.

Design note (Andes Appendix B, §4.3 "Overhead Estimation"), `LatencyModel`. Batch size
and total context are nearly perfectly correlated, so the token generation latency is
modelled as a function of B alone: τ(B) = ρ · decode_time(B, c̄), with c̄ the running
mean context of decoded requests and decode_time from the executor's cost model. ρ is
learned online: after each step that decodes, the observed inter-token time of the
decoded requests (from the end of the previous decoding step, so prefill steps in
between count, as they do for the reader) is divided by the prediction, and an EMA of
that ratio is kept. Overheads come from the same cost model: recompute = a prefill of
prompt + generated tokens (interpolated from a table), swap = KV bytes over the host
link. Without a cost model (tests) τ is the observed step time alone.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from andante.core.request import Request
from andante.engine.config import SchedulerConfig
from andante.engine.plan import StepPlan
from andante.exec.batch import StepBatch, StepResult
from andante.perf.cost_model import CostModel
from andante.policies.andes.options import AndesOptions
from andante.policies.andes.qoe import RequestTable, Streams, qoe_gain

RUNNING, WAITING, SWAPPED = 0, 1, 2
RUNNING_TIE = 1e-12  # running requests win ties (a zero-gain request costs nothing kept)
STARVED = 1e6  # above any gain per block: a starved request goes first


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
    #: `starvation` of this view, by (now, limit): one decision asks it up to twice
    starved_at: dict[tuple[float, float], np.ndarray | None] = field(default_factory=dict)

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
        weight = plan.num_blocks_for(tokens + 1.0)
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
class Solution:
    """The best packing of a solve, with the gains, priorities and τ of its B."""

    packing: Packing
    gain: np.ndarray
    priority: np.ndarray
    tau: float


def solve(view: View, latency: LatencyModel, options: AndesOptions, capacity: float,
          max_seqs: int, now: float, starved: np.ndarray | None) -> Solution:
    """Eq. 5 for every candidate B; the B of the largest total gain wins (ties: the
    larger B). `capacity`: M, the blocks the knapsack may fill."""
    batches = _batches(view, latency, options, capacity, max_seqs)
    tau = latency.tau(batches)[:, None]
    gains = qoe_gain(view.streams, now, options.delta_t, view.first_delay(tau), tau,
                     options.objective, view.streams)
    best: tuple[Packing, np.ndarray, int] | None = None
    for k, batch in enumerate(batches):
        prio = priority(gains[k], view.weight, view.kind, options, starved)
        packing = _pack(view, prio, gains[k], capacity, int(batch), options)
        if best is None or packing.value >= best[0].value:
            best = (packing, prio, k)
    assert best is not None
    packing, prio, k = best
    return Solution(packing, gains[k], prio, float(tau[k, 0]))


def _batches(view: View, latency: LatencyModel, options: AndesOptions, capacity: float,
             max_seqs: int) -> np.ndarray:
    """§4.2's candidate batch sizes (only B_max without the search)."""
    fast = max_seqs
    if options.batch_search:
        fast = latency.fastest_batch_within(float(view.streams.inv.min()))
    b_min, b_max = batch_range(view.weight, capacity, max_seqs, fast)
    return batch_candidates(b_min, b_max, options.max_batch_candidates)


def _pack(view: View, prio: np.ndarray, gain: np.ndarray, capacity: float, batch: int,
          options: AndesOptions) -> Packing:
    if options.solver == "dp":
        packing = dp_pack(prio, gain, view.weight, capacity, batch, options.dp_max_items,
                          options.dp_capacity_units)
        return fill(packing, prio, view.weight, capacity)
    return greedy_pack(prio, gain, view.weight, capacity, batch)


def priority(gain: np.ndarray, weight: np.ndarray, kind: np.ndarray, options: AndesOptions,
             starved: np.ndarray | None = None) -> np.ndarray:
    """Eq. 6: gain per KV block (gain alone if not size-aware); running bonus;
    `starved` (seconds past the starvation limit, <= 0 if not) goes first."""
    p = gain / weight if options.size_aware else np.array(gain, dtype=float)
    running = kind == RUNNING
    p = np.where(running, p * (1.0 + options.running_bonus) + RUNNING_TIE, p)
    if starved is not None:
        p = np.where(starved > 0, STARVED + starved, p)
    return p


def starvation(view: View, now: float, limit: float) -> np.ndarray | None:
    """Per view position: seconds a never-served queued request has waited past its
    TTFT target and the starvation `limit` (<= 0: not starved); None if nobody is."""
    if math.isinf(limit):
        return None
    known = view.starved_at
    if (now, limit) in known:
        return known[now, limit]
    s = view.streams
    wait = now - s.start - limit
    wait = np.where((view.kind != RUNNING) & (s.n == 0), wait, -1.0)
    starved = wait if bool((wait > 0).any()) else None
    known[now, limit] = starved
    return starved


# ---- the solvers ------------------------------------------------------------
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


# ---- the token latency model (Appendix B) ------------------------------------
FALLBACK_TOKEN_LATENCY = 0.02  # s, Andes' public code before any observation
FALLBACK_PREFILL_PER_TOKEN = 1e-4  # s
FALLBACK_SWAP_PER_TOKEN = 1e-5  # s
PREFILL_GRID = 64  # tokens between prefill-table points
CONTEXT_BUCKET = 64  # tokens; τ tables are cached per bucket of mean context
RATIO_BOUNDS = (0.25, 50.0)



class LatencyModel:
    def __init__(self, cost_model: CostModel | None, config: SchedulerConfig,
                 ema: float = 0.1) -> None:
        self.cost_model = cost_model
        self.max_batch = config.max_num_seqs
        self.ema = ema
        self._init_tables(config)
        self.ratio = 1.0  # observed / predicted token latency
        self.token_latency = FALLBACK_TOKEN_LATENCY  # observed inter-token time (EMA)
        self.mean_context = 512.0
        self._last_decode_end: float | None = None
        self._last_step_end: float | None = None

    def _init_tables(self, config: SchedulerConfig) -> None:
        self._tau_cache: dict[int, np.ndarray] = {}
        self._point_cache: dict[tuple[int, int], float] = {}  # (bucket, B) -> decode time
        grid = np.arange(0, config.max_model_len + PREFILL_GRID, PREFILL_GRID, dtype=float)
        self._prefill_grid = grid
        cm = self.cost_model
        if cm is None:
            self._prefill_table = grid * FALLBACK_PREFILL_PER_TOKEN
            self._swap_per_token = FALLBACK_SWAP_PER_TOKEN
            return
        self._prefill_table = np.array([cm.prefill_time(int(x)) for x in grid])
        self._swap_per_token = cm.swap_time(1)

    # ---- predictions ----------------------------------------------------------------
    def _decode_table(self) -> np.ndarray:
        """decode_time(B, c̄) for B = 0..max_batch (cached per context bucket)."""
        bucket = int(self.mean_context // CONTEXT_BUCKET)
        table = self._tau_cache.get(bucket)
        if table is None:
            ctx = bucket * CONTEXT_BUCKET + CONTEXT_BUCKET // 2
            cm = self.cost_model
            assert cm is not None
            table = np.array([cm.decode_time(b, ctx) for b in range(self.max_batch + 1)])
            self._tau_cache[bucket] = table
        return table

    def _decode_time_at(self, batch: int) -> float:
        """`_decode_table()[batch]`, without building the whole table for a new context
        bucket (the online refinement reads one batch size per step)."""
        bucket = int(self.mean_context // CONTEXT_BUCKET)
        table = self._tau_cache.get(bucket)
        if table is not None:
            return float(table[batch])
        key = (bucket, batch)
        value = self._point_cache.get(key)
        if value is None:
            cm = self.cost_model
            assert cm is not None
            value = float(cm.decode_time(batch, bucket * CONTEXT_BUCKET + CONTEXT_BUCKET // 2))
            self._point_cache[key] = value
        return value

    @overload
    def tau(self, batch: int) -> float: ...

    @overload
    def tau(self, batch: np.ndarray) -> np.ndarray: ...

    def tau(self, batch: np.ndarray | int) -> np.ndarray | float:
        """Predicted seconds per token for each request of a batch of size B."""
        if isinstance(batch, int) and self.cost_model is not None:  # (no array overhead,
            # nor a whole table for a new context bucket: one point of it)
            return self.ratio * self._decode_time_at(min(max(batch, 1), self.max_batch))
        b = np.clip(np.asarray(batch), 1, self.max_batch)
        if self.cost_model is None:
            return np.full(b.shape, self.token_latency)
        return self.ratio * self._decode_table()[b]

    def prefill_time(self, tokens: np.ndarray) -> np.ndarray:
        return np.interp(tokens, self._prefill_grid, self._prefill_table)

    def swap_time(self, tokens: np.ndarray) -> np.ndarray:
        """One-way copy of `tokens` tokens of KV between device and host."""
        return np.asarray(tokens, dtype=float) * self._swap_per_token

    def fastest_batch_within(self, seconds: float) -> int:
        """The largest B whose predicted τ(B) <= seconds (0 if none)."""
        if self.cost_model is None:
            return self.max_batch if self.token_latency <= seconds else 0
        table = self.ratio * self._decode_table()
        return int(np.searchsorted(table[1:], seconds, side="right"))

    # ---- online refinement ----------------------------------------------------------
    def observe(self, batch: StepBatch, result: StepResult, now: float) -> None:
        """Fold one completed step into the estimates (cheap: one pass over the batch)."""
        cached_tokens = batch.num_cached_tokens
        if batch.num_tokens == len(cached_tokens) and min(cached_tokens, default=0) > 0:
            num_dec, context = len(cached_tokens), sum(cached_tokens)  # all decodes
        else:
            num_dec = context = 0
            for new, cached in zip(batch.num_new_tokens, cached_tokens, strict=True):
                if new == 1 and cached > 0:
                    num_dec += 1
                    context += cached
        self.observe_decodes(num_dec, context, now)

    def observe_decodes(self, num_dec: int, context: int, now: float) -> None:
        """A step that ended at `now` decoded `num_dec` requests holding `context`
        tokens in all (what `observe` reads off a batch)."""
        self._last_step_end = now
        if num_dec:
            self._fold_decode(num_dec, context, now)

    def idle(self) -> None:
        """Nothing runs: the next decode's gap since the last one is no inter-token time.
        (Not inferred from gaps between steps: a real engine's loop spends time between
        steps, and readers wait through it too.)"""
        self._last_decode_end = None

    def run_times(self, token_times: list[float]) -> list[float]:
        """The times in `token_times` (a decoded request's) after the last observed
        step: the steps of a simulator decode run that no `observe` saw."""
        if self._last_step_end is None:
            return []
        return token_times[bisect_right(token_times, self._last_step_end):]

    def observe_run(self, times: list[float], num_dec: int, context: int) -> list[float]:
        """Fold a decode run (len(times) steps of `num_dec` decodes holding `context`
        tokens in its first step and one more per request in each next one, ending at
        `times`) into the estimates, as `observe` once per step would; returns the
        token latency before each step."""
        context -= num_dec  # (the context of a step before the run)
        if self.cost_model is None or self._last_decode_end is None:
            before = []
            for j, now in enumerate(times, start=1):
                before.append(self.token_latency)
                self._fold_decode(num_dec, context + j * num_dec, now)
        else:
            before = self._fold_run(num_dec, context, times)
        if times:
            self._last_step_end = times[-1]
        return before

    def _fold_run(self, num_dec: int, context: int, times: list[float]) -> list[float]:
        """`_fold_decode` for each of `times` (the same arithmetic, in locals: a decode
        run can stand for hundreds of steps)."""
        a, low, high = self.ema, *RATIO_BOUNDS
        mean, latency, ratio = self.mean_context, self.token_latency, self.ratio
        last = self._last_decode_end
        assert last is not None
        b = min(num_dec, self.max_batch)
        before = []
        # the bucket's mean-context range [floor, ceiling) keeps its predicted τ(b)
        floor, ceiling, predicted = math.inf, -math.inf, 0.0
        for j, now in enumerate(times, start=1):
            before.append(latency)
            mean += a * ((context + j * num_dec) / num_dec - mean)
            if now > last:
                gap = now - last
                latency += a * (gap - latency)
                if not floor <= mean < ceiling:
                    self.mean_context = mean
                    bucket = mean // CONTEXT_BUCKET
                    floor, ceiling = bucket * CONTEXT_BUCKET, (bucket + 1) * CONTEXT_BUCKET
                    predicted = self._decode_time_at(b)
                observed = gap / predicted
                observed = low if observed < low else high if observed > high else observed
                ratio += a * (observed - ratio)
            last = now
        self.mean_context, self.token_latency, self.ratio = mean, latency, ratio
        self._last_decode_end = last
        return before

    def _fold_decode(self, num_dec: int, context: int, now: float) -> None:
        a = self.ema
        self.mean_context += a * (context / num_dec - self.mean_context)
        last, self._last_decode_end = self._last_decode_end, now
        if last is None or now <= last:
            return
        gap = now - last
        self.token_latency += a * (gap - self.token_latency)
        if self.cost_model is not None:
            predicted = self._decode_time_at(min(num_dec, self.max_batch))
            low, high = RATIO_BOUNDS  # np.clip's value, without its per-call overhead
            observed = min(max(gap / predicted, low), high)
            self.ratio += a * (observed - self.ratio)


# ---- the queue's priority order, computed only as far as needed --------------------
#
# Design note (Andes §4.2 Eq. 6, Algorithm 1's `break`; §4.3). Between knapsack solves
# the policy admits the queue in priority order and stops at the first request that
# does not fit; the refiner pairs admissions in the same order and stops alike. So
# when the request first in line is not admitted (memory pressure: a long queue waits
# for blocks) the rest of the order, and the QoE gains it is sorted by, decide nothing.
# The first in line is known without any gain when a queued request is starved
# (`priority`: STARVED plus its wait, above any gain per block, which is at
# most 1.001 for every objective) and its priority is the unique largest: it is then
# the first index of `top_order` (a stable sort of the priorities, after a partition
# that keeps the largest). `QueueRanking` gives that first request at once and
# computes the gains, the priorities and the whole order only when asked
# (`order`, `scores`); the values are those of the plain computation, bit for bit
# (tests compare both).

#: τ, the queued requests' gains and every view position's starvation (or None).
Scores = tuple[float, np.ndarray, np.ndarray | None]


class QueueRanking:
    """The queued requests of `view` in priority order, lazily. `score()` gives τ and
    the queued requests' gains (`AndesPolicy._queue_scores`); `starved` is
    `knapsack.starvation` of the view now."""

    def __init__(self, view: View, options: AndesOptions, max_num_seqs: int,
                 starved: np.ndarray | None,
                 score: Callable[[], tuple[float, np.ndarray]]) -> None:
        self.view = view
        self.options = options
        self.max_num_seqs = max_num_seqs
        self.starved = starved
        self._score = score
        self._scores: Scores | None = None
        self._order: np.ndarray | None = None

    @property
    def first(self) -> int:
        """The view position of the queued request first in priority order."""
        nr = self.view.num_running
        if len(self.view) == nr + 1:
            return nr
        sure = self.sure_first()
        return int(self.order()[0]) if sure is None else sure

    def sure_first(self) -> int | None:
        """The first in line if a starved request's priority is the unique largest
        (no gain needed: see the module note); None otherwise."""
        if self.starved is None:
            return None
        waits = self.starved[self.view.num_running:]
        starved = waits > 0
        prio = STARVED + waits  # (as `knapsack.priority` computes it, where starved)
        best = int(np.argmax(np.where(starved, prio, -np.inf)))
        if np.count_nonzero(starved & (prio == prio[best])) != 1:
            return None  # a tie: the stable sort decides among them
        return self.view.num_running + best

    def scores(self) -> Scores:
        if self._scores is None:
            tau, gain = self._score()
            self._scores = (tau, gain, self.starved)
        return self._scores

    def order(self) -> np.ndarray:
        """View positions of the queued requests by priority, highest first (the top
        `max_num_seqs`); one queued request is first whatever its score."""
        if self._order is None:
            view = self.view
            nr = view.num_running
            if len(view) == nr + 1:
                self._order = np.array([nr])
            else:
                _, gain, starved = self.scores()
                queued = view.queued
                prio = priority(gain, view.weight[queued], view.kind[queued], self.options,
                                None if starved is None else starved[queued])
                self._order = top_order(prio, self.max_num_seqs) + nr
        return self._order
