"""Lookahead microbatch formation for pipeline groups (KunServe §4.3, eq. (1), Fig. 11).

Design note. A pipeline stalls when consecutive microbatches take unequal times (its
Figure 8): a stage waits for the slow one. Token-count chunking does not balance them,
because attention is quadratic: a chunk of c tokens after p cached ones costs, by the
paper's eq. (1),
    cost(p, c) = alpha * (p*c + (c^2 + c)/2) + beta * c   (+ gamma once per microbatch),
prefix attention, self attention, the MLP, and a per-microbatch constant. Under a burst
many requests are queued, so the scheduler can look ahead at all of them: Figure 11's
divide-and-conquer starts from one microbatch holding every pending token and splits
each microbatch into two of half its cost (a prefill chunk may be cut where the cost
reaches the half; a decode token may not), level by level, until there are as many
microbatches as stages or a microbatch has fewer than `min_tokens` tokens (too small to
use the GPU well). O(log L) levels of linear passes.

`bubble_ratio` replays microbatch costs through the stages (a microbatch's next round
starts only after its previous round left the last stage, as autoregressive decoding
requires) and returns the idle share of the stages, the figure §5.3 reports.

A grouped leader's budgets (`group_config`): a step holds a cycle's worth of work,
`num_stages` x one instance's token budget and `num_stages` x max_num_seqs (the members'
requests were adopted), the latter scaled by `seq_scale`, the group's KV blocks per
member over one undropped instance's (the simulator passes it; 1 by default). vLLM's
pipeline parallelism, which KunServe builds on, gives each of the `num_stages` virtual
engines max_num_seqs; but max_num_seqs is tuned to what one instance's KV holds, and the
point of a drop (§5.2: queued requests "served with a larger batch size") is that the
group's KV holds more: with the sequence cap left at num_stages x max_num_seqs the quick
experiment's 14B pair sat at 512 running with 100-140 queued while its KV was 70-87%
used, bound by the cap, not memory; `step_microbatches` cuts it into up to `num_stages` balanced
microbatches. Microbatches complete one by one (a request's tokens arrive when the
microbatch holding its last piece leaves the last stage), so steps overlap: a step formed
while `j` microbatches are still in flight fills the `num_stages - j` free slots
(`free_slots`), with that many instances' budgets (`slot_config`) cut into that many
microbatches. From an empty pipeline this is the whole cycle; in steady decoding each
returning microbatch's requests go round again as one microbatch, so the pipeline holds
`num_stages` microbatches without draining and none is cut smaller than it must be
(a prompt's inner chunk, which samples nothing, frees its request for its next chunk
once it has left stage 0: the next chunk follows it through every stage). The real
engine's pipelined stages (andante.exec.torch_microbatch) and the simulator's grouped
instances (andante.sim.kunserve_instance, which times the step as the pipeline of those
microbatches) both call these.

Lookahead across returning microbatches (`balanced_token_budget`): in steady state a
step fills one free slot while the other microbatches are still in flight, so halving
the step cannot balance anything; instead its prefill tokens are chosen by eq. (1) so
that its cost matches the dearest of the last `num_stages` microbatches (the ones it
runs beside and the one whose rows it re-forms): the queue's prefill fills what would
be a bubble, and no microbatch is cut below its partner (which would shrink the whole
pipeline's work round by round). `balanced_slot_config` is that decision on a slot's
budgets (only while the queue holds more prefill than the slot takes, §4.3); the
simulator's grouped instances and the real engine's group loop (andante.runtime.
kunserve_loop) both call it, each with its own microbatches' stage times. Eq. (1)'s
coefficients are fitted to the cost model (`fit_chunk_cost`): the paper profiles them
offline.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from andante.core.request import Request
from andante.engine.config import SchedulerConfig
from andante.exec.batch import StepBatch
from andante.exec.microbatch import Piece, free_slots
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape


@dataclass(frozen=True, slots=True)
class ChunkCostModel:
    """Eq. (1) coefficients (seconds per pair, per token, per microbatch)."""

    alpha: float
    beta: float
    gamma: float

    def __post_init__(self) -> None:
        if min(self.alpha, self.beta, self.gamma) < 0:
            raise ValueError(f"eq. (1) coefficients must be >= 0, got {self}")

    def chunk(self, prefix: int, tokens: int) -> float:
        return self.alpha * (prefix * tokens + (tokens * tokens + tokens) / 2) \
            + self.beta * tokens


@dataclass(frozen=True, slots=True)
class WorkItem:
    """`tokens` new tokens of a request after `prefix` cached ones; a prefill chunk
    may be split, a decode token not."""

    request_id: str
    prefix: int
    tokens: int
    splittable: bool = True


def microbatch_cost(items: Sequence[WorkItem], model: ChunkCostModel) -> float:
    if not items:
        return 0.0
    return model.gamma + sum(model.chunk(i.prefix, i.tokens) for i in items)


def _tokens_for_cost(item: WorkItem, budget: float, model: ChunkCostModel) -> int:
    """The largest c <= item.tokens with chunk(prefix, c) <= budget (closed form)."""
    a, b = model.alpha / 2, model.alpha * (item.prefix + 0.5) + model.beta
    if budget <= 0:
        return 0
    c = budget / b if a == 0 else (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)
    return max(0, min(item.tokens, int(c)))


def split_half(items: Sequence[WorkItem], model: ChunkCostModel
               ) -> tuple[list[WorkItem], list[WorkItem]]:
    """Two microbatches of about half the cost of `items` each (order kept)."""
    target = (microbatch_cost(items, model) - model.gamma) / 2  # each half pays gamma
    first: list[WorkItem] = []
    spent = 0.0
    for k, item in enumerate(items):
        cost = model.chunk(item.prefix, item.tokens)
        if spent + cost <= target:
            first.append(item)
            spent += cost
            continue
        rest = list(items[k + 1:])
        if item.splittable and item.tokens > 1:
            head = _tokens_for_cost(item, target - spent, model)
            if head > 0:
                first.append(WorkItem(item.request_id, item.prefix, head))
            tail = WorkItem(item.request_id, item.prefix + head, item.tokens - head)
            return first, [tail, *rest]
        if target - spent > spent + cost - target:  # the item lands nearer the half here
            return [*first, item], rest
        return first, [item, *rest]
    return first, []


def form_microbatches(items: Sequence[WorkItem], model: ChunkCostModel, num_stages: int,
                      min_tokens: int = 1) -> list[list[WorkItem]]:
    """Figure 11: halve by cost, level by level, until `num_stages` microbatches or
    every microbatch is below `2 * min_tokens` tokens (see the module note)."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    batches = [list(items)] if items else []
    while 0 < len(batches) < num_stages:
        grown: list[list[WorkItem]] = []
        for batch in batches:
            tokens = sum(i.tokens for i in batch)
            first, second = split_half(batch, model) if tokens >= 2 * min_tokens \
                else (batch, [])
            grown += [b for b in (first, second) if b]
        if len(grown) == len(batches):
            break
        batches = grown
    return batches


def balanced_token_budget(cost_with_prefill: Callable[[int], float], num_decodes: int,
                          target: float, cap: int, min_tokens: int = 1) -> int:
    """Token budget of a microbatch formed while others are in flight (a free slot of
    a pipeline whose microbatches are re-formed as they return): its `num_decodes`
    decodes (they always go) plus the most prefill tokens t whose microbatch cost,
    `cost_with_prefill(t)` (non-decreasing in t), stays within `target`, the cost of
    the microbatches it runs beside, so that the stages' times even out (Figure 8's
    bubbles) instead of the token count doing so; within [decodes + `min_tokens`,
    `cap`] (see the module note). Bisection: O(log cap) cost evaluations."""
    room = max(0, cap - num_decodes)
    low, high = 0, room  # cost(low) <= target or low == 0; find the largest such t
    if cost_with_prefill(high) <= target:
        low = high
    while high - low > 1:
        mid = (low + high) // 2
        if cost_with_prefill(mid) <= target:
            low = mid
        else:
            high = mid
    return max(1, min(cap, num_decodes + max(min_tokens, low)))


def bubble_ratio(costs: Sequence[float], num_stages: int, hop: float = 0.0,
                 rounds: int = 4) -> float:
    """Idle share of `num_stages` stages running `rounds` rounds of microbatches that
    take `costs` seconds per stage each (see the module note)."""
    if not costs or num_stages < 1:
        return 0.0
    stage_free = [0.0] * num_stages
    done = [0.0] * len(costs)  # when each microbatch last left the last stage
    for _ in range(rounds):
        for k, cost in enumerate(costs):
            t = done[k]
            for stage in range(num_stages):
                if stage:
                    t += hop
                t = max(t, stage_free[stage]) + cost
                stage_free[stage] = t
            done[k] = t
    span = max(done)
    busy = rounds * sum(costs) * num_stages
    return max(0.0, 1.0 - busy / (num_stages * span)) if span > 0 else 0.0


def fit_chunk_cost(cost: CostModel) -> ChunkCostModel:
    """Eq. (1)'s alpha, beta, gamma fitted (least squares) to the cost model's step
    times over prefill chunks and decode batches: the paper profiles them offline."""
    rows: list[tuple[float, float, float]] = []
    times: list[float] = []
    for prefix in (0, 512, 2048, 8192):
        for tokens in (1, 64, 512, 2048):
            rows.append((prefix * tokens + (tokens * tokens + tokens) / 2, tokens, 1.0))
            times.append(cost.prefill_time(tokens, prefix))
    for batch in (8, 64, 256):
        for context in (256, 2048):
            shape = BatchShape(num_seqs=batch, num_tokens=batch, num_sampled=batch,
                               num_decode_seqs=batch, attn_pairs=float(batch * (context + 1)),
                               kv_tokens_read=batch * (context + 1))
            rows.append((batch * (context + 1), batch, 1.0))
            times.append(cost.step_time(shape))
    solution = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)[0]
    alpha, beta, gamma = (max(0.0, float(v)) for v in solution)
    return ChunkCostModel(alpha, beta, gamma)


def group_config(base: SchedulerConfig, num_stages: int, seq_scale: float = 1.0
                 ) -> SchedulerConfig:
    """A grouped leader's budgets (module note): a step holds a cycle's worth of work,
    `num_stages` instances' tokens and sequences (with one instance's sequence cap the
    group could not admit a queued request until its running set fell below it), the
    sequences times `seq_scale` (the group's KV blocks per member over one instance's:
    the dropped weights' memory holds a larger batch, see the module note)."""
    if seq_scale <= 0:
        raise ValueError(f"seq_scale must be > 0, got {seq_scale}")
    return dataclasses.replace(
        base, max_num_seqs=max(1, math.ceil(base.max_num_seqs * num_stages * seq_scale)),
        max_num_batched_tokens=base.max_num_batched_tokens * num_stages)


def slot_config(base: SchedulerConfig, num_stages: int, in_flight: int,
                seq_scale: float = 1.0) -> SchedulerConfig:
    """The budgets of a step formed while `in_flight` microbatches are in the pipeline:
    `group_config` over its free slots (see the module note)."""
    return group_config(base, free_slots(num_stages, in_flight), seq_scale)


def step_microbatches(batch: StepBatch, num_stages: int, model: ChunkCostModel,
                      min_tokens: int = 1) -> list[list[Piece]]:
    """Figure 11 on one step of a pipeline group: the step's rows as eq. (1) work items
    (a prefill chunk splittable, a decode token not), halved by cost into up to
    `num_stages` microbatches; each microbatch as the executor's `Piece`s (a cut chunk
    becomes two pieces of its row). The real engine's microbatches (andante.exec.
    torch_microbatch) and the simulator's (andante.sim.kunserve_instance) both come
    from here."""
    items = [WorkItem(str(row), cached, new, new > 1) for row, (cached, new) in enumerate(
        zip(batch.num_cached_tokens, batch.num_new_tokens, strict=True))]
    return [[Piece(int(i.request_id), i.prefix, i.tokens) for i in micro]
            for micro in form_microbatches(items, model, num_stages, min_tokens)]


def lookahead_planner(model: ChunkCostModel, min_tokens: int = 1
                      ) -> Callable[[StepBatch, int], list[list[Piece]]]:
    """`step_microbatches` as an executor's `MicrobatchPlanner`."""
    def plan(batch: StepBatch, num_stages: int) -> list[list[Piece]]:
        return step_microbatches(batch, num_stages, model, min_tokens)
    return plan


# ---- lookahead across returning microbatches: the decision both engines call -------
def stage_cost_model(full: CostModel, layer_slices: Sequence[tuple[int, int]]) -> CostModel:
    """One stage's cost model: the full model's with the widest slice's layers (the
    slowest stage paces the pipeline)."""
    widest = max(end - start for start, end in layer_slices)
    return CostModel(dataclasses.replace(full.model, num_layers=widest), full.hardware,
                     tp=full.tp)


def queued_work(running: Sequence[Request], waiting: Sequence[Request],
                in_flight: Collection[str]) -> tuple[list[int], int]:
    """What a step formed beside microbatches in flight may take: the cached tokens of
    each decode not in flight, and the prefill tokens queued (running requests not in
    flight with more than one token to compute, and every waiting one)."""
    free = [r for r in running if r.request_id not in in_flight]
    decodes = [r.num_computed_tokens for r in free if r.num_uncomputed_tokens == 1]
    queued = sum(r.num_uncomputed_tokens for r in free if r.num_uncomputed_tokens > 1)
    return decodes, queued + sum(r.num_uncomputed_tokens for r in waiting)


def balanced_slot_config(config: SchedulerConfig, stage_cost: CostModel,
                         decode_prefixes: Sequence[int], queued_tokens: int,
                         recent: Sequence[float]) -> SchedulerConfig:
    """A free slot's budgets with lookahead (module note): when more prefill is queued
    than the slot takes (a burst: with a short queue, holding prompt tokens back would
    only add to their TTFT) and earlier microbatches have run (`recent`: the stage
    seconds of the last `num_stages` of them, by `stage_cost`), the token budget whose
    stage time, the free decodes (`decode_prefixes`: their cached tokens) plus that
    much prefill, matches the dearest of them (`balanced_token_budget`); else `config`
    as it is. The simulator's grouped instances and the real engine's group loop
    (andante.runtime.kunserve_loop) both decide through this."""
    if not recent or queued_tokens <= config.max_num_batched_tokens - len(decode_prefixes):
        return config
    base = BatchShape()
    for prefix in decode_prefixes:
        base.add(1, prefix, True)

    def with_prefill(tokens: int) -> float:
        shape = dataclasses.replace(base)
        if tokens:
            shape.add(tokens, 0, False)
        return stage_cost.step_time(shape)

    budget = balanced_token_budget(with_prefill, len(decode_prefixes), max(recent),
                                   config.max_num_batched_tokens, config.block_size)
    return dataclasses.replace(config, max_num_batched_tokens=budget)
