"""FastServe's key-value cache management: who is swapped out, who comes back, when.

Design note: FastServe §4.2 (proactive key-value cache swapping), on top of the step
choice of `choice.py`.
- Room: blocks the batch needs are freed by swapping out paused jobs without a place,
  the one with the largest ENST first (recompute only when the host tier is full); the
  step waits for these copies, as it does for swap-ins of jobs it runs.
- Proactive mode (default): a swapped job with a place is not run in the step that
  brings it back: it is swapped in ahead of need, smallest ENST first, and paused jobs
  without a place are swapped out, largest ENST first, to keep the reserve of idle
  slots free and to make room for those swap-ins. No forward pass needs these copies,
  so they overlap it: each step moves at most `swap_budget` x its predicted forward
  time of them (at least one job). Paused jobs that stay on the device still run.
  "reactive" swaps only when a step needs the room and brings a swapped job back in the
  step that runs it; "recompute" drops the KV of paused jobs instead of swapping it.
- Ping-pong: a request is never swapped in and out in one step (the plan refuses it);
  by default no proactive swap-in happens in a step that swaps out (FastServe's code).
- Reserve: idle slots for the arrivals of the next `horizon` seconds, from the rate and
  prompt sizes over a sliding window (§4.2 "handling a burst of new jobs").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Sequence

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.plan import StepPlan
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.policies.fastserve.choice import StepChoice, fill

_SWAPPED = RequestStatus.SWAPPED
_HOLDS_KV = (RequestStatus.RUNNING, RequestStatus.SWAPPED)
_SWAP = PreemptionMode.SWAP
KV_MODES = ("proactive", "reactive", "recompute")
Enst = Callable[[Collection[Request]], dict[Request, float]]  # ENST of the given jobs


class ArrivalRate:
    """Recent arrivals (time, KV blocks of the prompt) over a sliding window."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._events: deque[tuple[float, int]] = deque()
        self._sum_blocks = 0

    def observe(self, now: float, blocks: int) -> None:
        self._events.append((now, blocks))
        self._sum_blocks += blocks

    def expected_blocks(self, now: float, horizon: float) -> float:
        """KV blocks the arrivals of the next `horizon` seconds will ask for."""
        events = self._events
        while events and events[0][0] < now - self.window:
            self._sum_blocks -= events.popleft()[1]
        if not events:
            return 0.0
        rate = len(events) / self.window
        return rate * horizon * self._sum_blocks / len(events)


def _free_blocks(plan: StepPlan, admits: bool) -> int:
    """The free device blocks a batch may take (above the watermark if it `admits`)."""
    return plan.num_free_blocks_above_watermark if admits else plan.num_free_blocks


class KVPlanner:
    """Records one step's evictions, swap-ins and schedules on the plan (§4.2)."""

    def __init__(self, mode: str, cost_model: CostModel | None, swap_budget: float,
                 swap_in_after_swap_out: bool = False) -> None:
        if mode not in KV_MODES:
            raise ValueError(f"kv_mode must be one of {KV_MODES}, got {mode!r}")
        self.mode = mode
        self.cost_model = cost_model
        self.swap_budget = swap_budget
        self.swap_in_after_swap_out = swap_in_after_swap_out
        self.protected: Collection[Request] = ()  # this step's jobs never evicted

    @property
    def runs_swapped(self) -> bool:
        """May a step run a job it swaps in (the copy then delays the step)?"""
        return self.mode != "proactive"

    def apply(self, plan: StepPlan, choice: StepChoice, order: Sequence[Request],
              reserve: int, enst: Enst) -> None:
        """Evict for the batch (and, proactively, for the reserve and the next jobs),
        schedule the batch, then swap in the next jobs ahead of need."""
        ranks: dict[Request, float] = {}

        def get_ranks() -> dict[Request, float]:
            if not ranks:
                ranks.update(enst({*choice.unplaced, *choice.to_fetch}))
            return ranks

        spare = list(choice.unplaced)
        if spare:  # victims: pop() takes the largest ENST
            enst_of = get_ranks()
            spare.sort(key=enst_of.__getitem__)
        need = self._blocks_to_place(plan)
        deficit = need - _free_blocks(plan, choice.any_new)
        while deficit > 0 and spare:
            deficit -= self._evict(plan, spare.pop())
        if deficit > 0:  # last resort: placed jobs that do not run this step
            deficit = self._evict_placed(plan, deficit, enst)
        if deficit > 0 and self.protected:  # the churn bound yields to progress
            self.protected = ()
            deficit = need - _free_blocks(plan, choice.any_new)
            kept = [r for r in choice.unplaced if not plan.is_preempted(r)]
            kept.sort(key=get_ranks().__getitem__)
            while deficit > 0 and kept:
                deficit -= self._evict(plan, kept.pop())
            if deficit > 0:
                self._evict_placed(plan, deficit, enst)
        fetch: list[Request] = []
        budget = math.inf
        # (a bool, not the list: `_make_room` below empties `spare`)
        proactive = self.mode == "proactive" and bool(spare or choice.to_fetch)
        claims = list(zip(plan.claimed, plan.num_claimed_tokens, strict=True)) \
            if proactive else []
        # `_make_room` swaps out spare jobs, the last first, and stops at one the host
        # cannot take: then it moves nothing, whatever the budget and the fetch order
        made_room = proactive and bool(spare) and plan.can_preempt(spare[-1], _SWAP)
        if made_room:
            budget = self._transfer_budget(plan, claims)
            fetch = self._fetch_order(plan, choice, get_ranks)
            budget -= self._make_room(plan, reserve, spare, fetch, budget)
        free = _free_blocks(plan, choice.any_new) - need
        fill(plan, [r for r in choice.unplaced if not plan.is_preempted(r)], free)
        if not plan.claimed:  # nothing ready fits: run the best job, whatever it costs
            self._run_first(plan, order, spare)
        self._place(plan)
        if proactive and (self.swap_in_after_swap_out or not _swapped_out(plan)):
            if not made_room and _may_fetch(plan, reserve, choice.to_fetch):
                # no room was made: the order and budget only matter to a swap-in
                # that can happen (`_prefetch`'s first test)
                budget = self._transfer_budget(plan, claims)
                fetch = self._fetch_order(plan, choice, get_ranks)
            if fetch:
                self._prefetch(plan, reserve, fetch, budget)

    @staticmethod
    def _blocks_to_place(plan: StepPlan) -> int:
        need = 0
        for req, n in zip(plan.claimed, plan.num_claimed_tokens, strict=True):
            need += plan.blocks_needed(req, n)
            if req.status == _SWAPPED:
                need += plan.num_blocks_of(req)
        return need

    def _evict(self, plan: StepPlan, victim: Request, swap_only: bool = False) -> int:
        """Preempt `victim`; returns the device blocks it frees (0 if it was kept)."""
        if victim in self.protected or not plan.can_preempt(victim, PreemptionMode.RECOMPUTE):
            return 0
        blocks = plan.num_blocks_of(victim)
        swap = self.mode != "recompute" and plan.can_preempt(victim, _SWAP)
        if swap_only and not swap:
            return 0
        plan.preempt(victim, _SWAP if swap else PreemptionMode.RECOMPUTE)
        return blocks

    def _evict_placed(self, plan: StepPlan, deficit: int, enst: Enst) -> int:
        """Evict paused placed jobs, largest ENST first; returns the deficit left."""
        paused = [r for r in plan.running
                  if not plan.is_claimed(r) and not plan.is_preempted(r)]
        ranks = enst(paused)
        paused.sort(key=ranks.__getitem__, reverse=True)
        for victim in paused:
            if deficit <= 0:
                break
            deficit -= self._evict(plan, victim)
        return deficit

    def _transfer_budget(self, plan: StepPlan, claims: Sequence[tuple[Request, int]]) -> float:
        """Blocks that can move while the forward pass of `claims` (this step's batch
        before any fill) runs."""
        cost = self.cost_model
        if cost is None or not claims:
            return math.inf if cost is None else 0.0
        shape = BatchShape()
        for req, n in claims:
            cached = req.num_computed_tokens
            shape.add(n, cached, cached + n == req.num_tokens)
        per_block = cost.swap_time(plan.block_size)
        return self.swap_budget * cost.step_time(shape) / per_block if per_block else math.inf

    @staticmethod
    def _fetch_order(plan: StepPlan, choice: StepChoice,
                     get_ranks: Callable[[], dict[Request, float]]) -> list[Request]:
        fetch = [r for r in choice.to_fetch if not plan.is_claimed(r)]
        if fetch:
            ranks = get_ranks()
            fetch.sort(key=lambda r: ranks.get(r, math.inf))  # smallest ENST first
        return fetch

    def _make_room(self, plan: StepPlan, reserve: int, spare: list[Request],
                   fetch: list[Request], budget: float) -> int:
        """Swap out spare jobs until the reserve and the next swap-ins fit; returns the
        blocks moved. Always moves at least one job if it must."""
        want = reserve + plan.watermark_blocks
        for req in fetch:
            size = plan.num_blocks_of(req)
            if want > reserve + plan.watermark_blocks and want + size > budget:
                break
            want += size
        moved = 0
        while spare and plan.num_free_blocks < want and (not moved or moved < budget):
            if not plan.can_preempt(spare[-1], _SWAP):
                break  # host tier full: no proactive recompute
            moved += self._evict(plan, spare.pop(), swap_only=True)
        return moved

    def _run_first(self, plan: StepPlan, order: Sequence[Request],
                   spare: list[Request]) -> None:
        """Progress when no ready job fits: the first job of the order on the device (else
        on the host) runs, evicting paused jobs (largest ENST first; recompute if the host
        tier is full) until it fits."""
        holders = [r for r in order if r.status in _HOLDS_KV and not plan.is_preempted(r)
                   and not plan.is_in_flight(r)]
        first = next((r for r in holders if r.status != _SWAPPED), None)
        req = first if first is not None else next(iter(holders), None)
        if req is None:
            return
        n = req.num_uncomputed_tokens
        need = plan.blocks_needed(req, n)
        if req.status == _SWAPPED:
            need += plan.num_blocks_of(req)
        # largest ENST first among the spare jobs, then the lowest priority first
        victims = [v for v in reversed(spare) if v is not req and not plan.is_preempted(v)]
        spared = set(victims)
        victims += [v for v in reversed(holders)
                    if v.status != _SWAPPED and v is not req and v not in spared]
        for victim in victims:
            if need <= plan.num_free_blocks:
                break
            self._evict(plan, victim)
        if plan.can_claim(n) and need <= plan.num_free_blocks:
            plan.claim(req, n)

    @staticmethod
    def _place(plan: StepPlan) -> None:
        for req in plan.claimed:
            if req.status == _SWAPPED and plan.can_swap_in(req):
                plan.swap_in(req)
        plan.schedule_claims()

    @staticmethod
    def _prefetch(plan: StepPlan, reserve: int, fetch: list[Request],
                  budget: float) -> None:
        floor = reserve + plan.watermark_blocks
        moved = 0
        for req in fetch:
            if plan.is_claimed(req):
                continue
            blocks = plan.num_blocks_of(req)
            if moved and moved + blocks > budget:
                return
            if plan.num_free_blocks - blocks < floor or not plan.can_swap_in(req):
                return
            moved += blocks
            plan.swap_in(req)


def _may_fetch(plan: StepPlan, reserve: int, to_fetch: Sequence[Request]) -> bool:
    """Could `KVPlanner._prefetch` swap in any of `to_fetch` now (some unclaimed one
    leaves the floor free)?"""
    floor, free = reserve + plan.watermark_blocks, plan.num_free_blocks
    return any(free - plan.num_blocks_of(r) >= floor
               for r in to_fetch if not plan.is_claimed(r))


def _swapped_out(plan: StepPlan) -> bool:
    return any(mode == _SWAP for _, mode in plan.preemptions)
