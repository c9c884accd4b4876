"""`andes`: QoE-aware token-level preemptive scheduling (Andes, §4).

Design note. Every step the policy sees running, waiting and swapped requests as
numpy arrays (`View`) over incrementally kept QoE state (`gain.py`). When the system
is memory-bound (KV usage >= watermark with requests queued) or compute-bound (the
observed token latency exceeds the most stringent reader's pace) — selective
triggering, §4.2, considered every `solver_interval` steps — it solves the knapsack of
Eq. 5 for each candidate batch size B in [B_min, B_max] (greedy Alg. 1 or the DP of
Appendix C), keeps the best, and lets the overhead-aware refiner (§4.3) decide which
admission/preemption pairs are worth their cost. Otherwise it orders the queue by QoE
gain per KV block and admits in that order, through the same refiner (a prefill stalls
the running streams); a reader whose pacer holds more than Δt of text (its gain over Δt
is 0) may then be preempted to admit a queued request (§3.2: the scheduler and the
token pacer are one design). With `chunked_prefill=False` steps are prefill-first as in
vLLM v0, where Andes is implemented (§5): the chosen victims are preempted, the chosen
waiting and swapped requests admitted in priority order until one does not fit
(Algorithm 1's `break`), and only if no prefill was scheduled every running request
advances by one token, the lowest-priority one preempted when blocks run dry — the
shared loops of `phases.py`. With chunked prefill (the default; issue 14) the same
decision is carried out as vLLM v1 / Sarathi-Serve steps: the running requests advance
first, the admissions then take prefill chunks from what is left of the step's token
budget, so a long prompt no longer stalls every stream for its whole prefill.

The simulator's fast paths (declaring decode and prefill runs, replaying their state)
are `runs.py`'s `RunReplay`, the overhead-aware refiner (§4.3) `refiner.py`'s
`OverheadRefiner`, both mixins of `AndesPolicy` over its state; carrying a decision out
through the shared loops is `carry.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.fast_path import FastPathDefaults
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy, PolicyContext
from andante.exec.batch import StepBatch, StepResult
from andante.policies.andes.carry import (
    Decision,
    carry_out,
    decodes_first,
    empties_queue,
    schedules_prompt_chunk,
)
from andante.policies.andes.gain import (
    RequestTable,
    Streams,
    objective_gain,
    qoe_at,
    qoe_wait_served,
)
from andante.policies.andes.latency import LatencyModel
from andante.policies.andes.options import AndesOptions
from andante.policies.andes.refiner import OverheadRefiner
from andante.policies.andes.runs import RunReplay
from andante.policies.andes.solver import (
    RUNNING,
    Packing,
    View,
    ascending,
    batch_candidates,
    batch_range,
    dp_pack,
    fill,
    greedy_pack,
    top_order,
)
from andante.policies.phases import (
    TokenCount,
    advance_with_preemption,
    budgeted,
    remaining_tokens,
)

RUNNING_TIE = 1e-12  # running requests win ties (a zero-gain request costs nothing kept)
STARVED = 1e6  # above any gain per block: a starved request goes first


@dataclass(slots=True)
class AndesStats:
    num_solves: int = 0  # knapsack invocations (selective triggering let them run)


class AndesPolicy(RunReplay, OverheadRefiner, BasePolicy, FastPathDefaults):
    name = "andes"
    Options = AndesOptions
    chunks_prefill = AndesOptions().chunked_prefill  # per instance: the option's value

    @classmethod
    def preemption_options(cls, mode: PreemptionMode) -> dict[str, Any]:
        """A fixed mechanism instead of the per-request cheaper one (§4.3)."""
        return {"preemption": "swap" if mode == PreemptionMode.SWAP else "recompute"}

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._init_state()

    def _init_state(self) -> None:
        self.chunks_prefill = self.options.chunked_prefill
        refine = self.options.refine_admissions
        self.refine_admissions = not self.chunks_prefill if refine is None else refine
        limit = self.options.starvation_limit
        if limit is None and self.chunks_prefill:
            limit = 0.0
        self.starvation_limit = math.inf if limit is None else limit
        self.table = RequestTable()
        self.latency = LatencyModel(self.ctx.cost_model, self.ctx.config,
                                    self.options.latency_ema)
        self.stats = AndesStats()
        self._since_solve = self.options.solver_interval
        self._prefilling = False  # the last step scheduled a prompt chunk
        self._init_runs()

    # ---- hooks ----------------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        self.table.add(req)

    def on_finish(self, req: Request) -> None:
        self.table.remove(req)

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None:
        now = self.now
        tokens = result.sampled_token_ids
        if None not in tokens and all(batch.samples):
            got = batch.requests  # the common case: every request got a token
        else:
            got = [req for i, req in enumerate(batch.requests)
                   if batch.samples[i] and tokens[i] is not None]
        table = self.table
        slots = table.slots_of(got)
        if table.few_records(len(slots), 1):
            table.record_few(slots, (now,))
        else:
            table.record(np.array(slots, dtype=np.intp), now)
        self.latency.observe(batch, result, now)

    # ---- one step -------------------------------------------------------------------
    def schedule(self, plan: StepPlan) -> None:
        if self.stationary:  # the decode runs since the last decision are replayed
            self.stationary = False
        self._since_solve += 1
        if not plan.running:
            self.latency.idle()
        if not (plan.running or plan.waiting or plan.swapped):
            return
        plan.restrict_token_budget(self._step_token_budget(len(plan.running)))
        self._queued_run, self.run_step_limit = False, math.inf  # see _declare_queued_run
        self.decode_run_reserve_blocks = 0 if self.options.refiner else plan.watermark_blocks
        if not (plan.waiting or plan.swapped) and self._decode_all(plan):
            return
        view = View.of(self.table, plan, self.latency)
        if self._triggered(plan, view):
            self._since_solve = 0
            self.stats.num_solves += 1
            decision = self._solve(plan, view)
        else:
            decision = self._order_queue(plan, view)
        self._carry_out(plan, decision)
        if not decision.victims and empties_queue(plan):
            self._declare_stationary(plan, float(view.streams.inv.min()))
        else:
            self._declare_queued_run(plan, view)

    def _decode_all(self, plan: StepPlan) -> bool:
        """Nothing queued and the knapsack not due: what `_order_queue` decides (decode
        every running request, the emptiest pacer buffers first), without its arrays;
        False (nothing done) when the knapsack is due."""
        idx = self.table.indices(plan.running)
        min_inv = float(self.table.inv[idx].min())
        if self._since_solve >= self.options.solver_interval and (
                self.latency.token_latency > min_inv):
            return False
        running = plan.running
        if self._may_run_short(plan):
            decode_order = [running[i] for i in ascending(self.table.buffered(idx, plan.now))]
        else:  # every request finds its blocks: the order decides nothing
            decode_order = list(running)
        num_tokens: TokenCount = remaining_tokens
        if self.chunks_prefill:
            num_tokens = budgeted(plan)
            if self._prefilling:
                decode_order = decodes_first(decode_order)
        advance_with_preemption(plan, decode_order, num_tokens, partial(self._mode_for, plan))
        self._prefilling = schedules_prompt_chunk(plan)
        self._declare_stationary(plan, min_inv)
        return True

    def _step_token_budget(self, num_running: int) -> int:
        """A step's token budget: one token per running request plus `chunk_tokens`
        with chunked prefill, within the engine's cap."""
        cap = self.ctx.config.max_num_batched_tokens
        if self.chunks_prefill and self.options.chunk_tokens:
            return min(cap, num_running + self.options.chunk_tokens)
        return cap

    def _may_run_short(self, plan: StepPlan) -> bool:
        """Could the running requests' next tokens need more blocks than are free (one
        each, plus the prompt chunks the budget allows)?"""
        return self._runs_short(len(plan.running), plan.token_budget, plan.num_free_blocks)

    def _runs_short(self, num_running: int, token_budget: int, num_free_blocks: int) -> bool:
        need = num_running + token_budget // self.ctx.config.block_size + 1
        return num_free_blocks < need


    def _triggered(self, plan: StepPlan, view: View) -> bool:
        """Selective triggering (§4.2)."""
        if self._since_solve < self.options.solver_interval or not view.num_running:
            return False
        used = 1.0 - plan.num_free_blocks / max(1, plan.num_total_blocks)
        if used >= self.options.watermark and len(view) > view.num_running:
            return True
        return self.latency.token_latency > float(view.streams.inv.min())

    # ---- the knapsack (§4.2) --------------------------------------------------------
    def _solve(self, plan: StepPlan, view: View) -> Decision:
        """Eq. 5 for every candidate B; the B of the largest total gain wins (ties: the
        larger B). M is what the running requests hold plus the free blocks, less the
        block manager's admission watermark."""
        nr = view.num_running
        capacity = plan.num_free_blocks + float(view.weight[:nr].sum()) - plan.watermark_blocks
        batches = self._batches(plan, view, capacity)
        tau = self.latency.tau(batches)[:, None]
        gains = self.gain(view.streams, plan.now, view.first_delay(tau), tau, view)
        best: Packing | None = None
        best_k = 0
        starved = self.starved(view, plan.now)
        for k, batch in enumerate(batches):
            packing = self._pack(view, gains[k], capacity, int(batch), starved)
            if best is None or packing.value >= best.value:
                best, best_k = packing, k
        assert best is not None
        return self._decide(plan, view, best, gains[best_k], float(tau[best_k, 0]), starved)

    def _batches(self, plan: StepPlan, view: View, capacity: float) -> np.ndarray:
        """§4.2's candidate batch sizes (only B_max without the search)."""
        o = self.options
        max_seqs = plan.config.max_num_seqs
        fast = max_seqs
        if o.batch_search:
            fast = self.latency.fastest_batch_within(float(view.streams.inv.min()))
        b_min, b_max = batch_range(view.weight, capacity, max_seqs, fast)
        return batch_candidates(b_min, b_max, o.max_batch_candidates)

    def _pack(self, view: View, gain: np.ndarray, capacity: float, batch: int,
              starved: np.ndarray | None = None) -> Packing:
        o = self.options
        prio = self.priority(gain, view.weight, view.kind, starved)
        if o.solver == "dp":
            packing = dp_pack(prio, gain, view.weight, capacity, batch, o.dp_max_items,
                              o.dp_capacity_units)
            return fill(packing, prio, view.weight, capacity)
        return greedy_pack(prio, gain, view.weight, capacity, batch)

    def _decide(self, plan: StepPlan, view: View, best: Packing, gain: np.ndarray,
                tau: float, starved: np.ndarray | None = None) -> Decision:
        """Chosen queued requests become admissions in priority order, unchosen running
        ones candidate victims from the lowest priority up. Without the refiner every
        victim is preempted, as the knapsack decided; with it, a victim that no kept
        admission needs the memory of keeps running (pausing it would hold its KV and
        its sequence slot while serving nobody)."""
        nr = view.num_running
        prio = self.priority(gain, view.weight, view.kind, starved)
        chosen = best.chosen
        selected = np.zeros(len(view), dtype=bool)
        selected[chosen] = True
        admits = chosen[view.kind[chosen] != RUNNING]
        dropped = np.flatnonzero(~selected[:nr])
        victims = dropped[np.argsort(prio[dropped], kind="stable")]
        admit_reqs, victim_reqs = self.refine(plan, view, admits, victims, gain, tau,
                                              starved)
        if not self.options.refiner:
            cap = self.options.max_preemptions
            victim_reqs = [view.reqs[i] for i in (victims if cap is None else victims[:cap])]
        decode = np.argsort(-prio[:nr], kind="stable")
        return Decision(admit_reqs, victim_reqs, [view.reqs[i] for i in decode])

    # ---- between solves: cheap ordering, pacer-aware preemption ---------------------
    def _order_queue(self, plan: StepPlan, view: View) -> Decision:
        """Decode the emptiest pacer buffers first; admit the queue by priority (its
        scores are computed only where they decide something: a lone queued request
        is first whatever its score, unless the refiner weighs it)."""
        now, nr = plan.now, view.num_running
        buffered = view.streams.buffered(now, nr)
        by_need = ascending(buffered)  # emptiest buffers first
        reqs = view.reqs
        decision = Decision(decode_order=[reqs[i] for i in by_need])
        if len(view) == nr or self._admits_nobody(plan, view, buffered):
            return decision
        scores = None
        if len(view) == nr + 1:
            order = np.array([nr])
        else:
            scores = tau, gain, starved = self._queue_scores(plan, view)
            prio = self.priority(gain, view.weight[view.queued], view.kind[view.queued],
                                 None if starved is None else starved[view.queued])
            order = top_order(prio, plan.config.max_num_seqs) + nr
        decision.admits = [view.reqs[i] for i in order]
        o = self.options
        victims = np.empty(0, dtype=np.intp)
        fits = (o.pacer_aware or o.pause_buffered_s > 0) and self._fits(plan, decision.admits[0])
        if o.pacer_aware and not fits:
            most = np.array(by_need[::-1], dtype=np.intp)
            victims = most[buffered[most] > o.delta_t]  # most buffered first, gain 0 over Δt
        elif fits and o.pause_buffered_s > 0 and self._admits_all(plan, view):
            decision.decode_order = [view.reqs[i] for i in by_need
                                     if buffered[i] <= o.pause_buffered_s]
        if len(victims) or (o.refiner and self.refine_admissions and nr):
            tau, gain, starved = scores or self._queue_scores(plan, view)
            gains = np.zeros(len(view))
            gains[view.queued] = gain
            decision.admits, decision.victims = self.refine(
                plan, view, order, victims, gains, tau, starved)
        return decision

    def _queue_scores(self, plan: StepPlan, view: View,
                      ) -> tuple[float, np.ndarray, np.ndarray | None]:
        """τ at the current batch size, the queued requests' gains and every view
        position's starvation (`starved`)."""
        nr = view.num_running
        tau = self.latency.tau(max(1, nr))
        queued = view.queued  # (a slice: views of the arrays, no gathers)
        gain = self.gain(view.streams.select(queued), plan.now,
                         view.base[queued] + view.step[queued] * tau, tau, view)
        return float(tau), gain, self.starved(view, plan.now)

    def _admits_nobody(self, plan: StepPlan, view: View, buffered: np.ndarray) -> bool:
        """With chunked prefill, True when the running requests' remaining tokens fill
        the step's token budget (nobody queued can be admitted, whatever the order) and
        no admission could pair with a victim: no pacer holds more than Δt, or every
        queued request fits in the free memory. The decision is then the decode order
        alone, so the gains are not computed (the simulator's queued steps during a
        long prompt's chunks)."""
        if not (self.chunks_prefill and self._prefilling):  # else all decode: budget left
            return False
        if not self._running_fill_budget(plan):
            return False
        o = self.options
        if not o.pacer_aware or not bool((buffered > o.delta_t).any()):
            return True
        num_queued = len(view) - view.num_running
        return num_queued <= plan.config.max_num_seqs and self._queue_fits(plan, view)

    @staticmethod
    def _queue_fits(plan: StepPlan, view: View) -> bool:
        """Do all the queued requests' blocks fit in the free ones above the watermark?"""
        free = plan.num_free_blocks - plan.watermark_blocks
        return float(view.weight[view.queued].sum()) <= free

    @staticmethod
    def _running_fill_budget(plan: StepPlan) -> bool:
        """Do the running requests' remaining tokens fill the step's token budget?
        (Stops counting once they do: a long prompt's chunk usually does at once.)"""
        left = plan.token_budget
        for req in plan.running:
            left -= req.num_uncomputed_tokens
            if left <= 0:
                return True
        return left <= 0

    def _admits_all(self, plan: StepPlan, view: View) -> bool:
        """With chunked prefill: can every queued request join the running ones now
        (half the sequence slots at most, free blocks beside the watermark, a token
        budget that running prompt chunks do not fill)? Only then may buffered streams
        sit a step out (`pause_buffered_s`): when the queue waits for slots or memory,
        slowing the streams that free them would make it wait longer (simulated at
        3 req/s, pausing up to the full slot count cost mean QoE 0.991 -> 0.984)."""
        if not self.chunks_prefill or 2 * len(view) > plan.config.max_num_seqs:
            return False
        if self._prefilling and self._running_fill_budget(plan):
            return False  # running chunks take the step: as `_admits_nobody`
        return self._queue_fits(plan, view)

    @staticmethod
    def _fits(plan: StepPlan, req: Request) -> bool:
        n = req.num_uncomputed_tokens
        if req.status == RequestStatus.SWAPPED:
            return plan.num_blocks_of(req) + plan.blocks_needed(req, n) <= plan.num_free_blocks
        return plan.can_schedule(req, n)

    # ---- gains ----------------------------------------------------------------------
    def gain(self, s: Streams, now: float, first: np.ndarray, tau: np.ndarray | float,
             view: View) -> np.ndarray:
        t = now + self.options.delta_t
        q_wait, q_serve = qoe_wait_served(s, now, t, first, tau)
        objective = self.options.objective
        if objective == "avg":
            return objective_gain(objective, q_serve, q_wait, q_wait)
        q_now = qoe_at(s, now, now)
        q_min = float(qoe_at(view.streams, now, now).min())
        return objective_gain(objective, q_serve, q_wait, q_now, q_min)

    def priority(self, gain: np.ndarray, weight: np.ndarray, kind: np.ndarray,
                 starved: np.ndarray | None = None) -> np.ndarray:
        """Eq. 6: gain per KV block (gain alone if not size-aware); running bonus;
        `starved` (seconds past the starvation limit, <= 0 if not) goes first."""
        p = gain / weight if self.options.size_aware else np.array(gain, dtype=float)
        running = kind == RUNNING
        p = np.where(running, p * (1.0 + self.options.running_bonus) + RUNNING_TIE, p)
        if starved is not None:
            p = np.where(starved > 0, STARVED + starved, p)
        return p

    def starved(self, view: View, now: float) -> np.ndarray | None:
        """Per view position: seconds a never-served queued request has waited past its
        TTFT target and the starvation limit (<= 0: not starved); None if nobody is."""
        if math.isinf(self.starvation_limit):
            return None
        s = view.streams
        wait = now - s.start - self.starvation_limit
        wait = np.where((view.kind != RUNNING) & (s.n == 0), wait, -1.0)
        return wait if bool((wait > 0).any()) else None

    # ---- carrying a decision out (carry.py) ----------------------------------------
    def _carry_out(self, plan: StepPlan, decision: Decision) -> None:
        carry_out(plan, decision, self.chunks_prefill, partial(self._mode_for, plan))
        if self.chunks_prefill:
            self._prefilling = schedules_prompt_chunk(plan)
