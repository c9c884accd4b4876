"""`andes`: QoE-aware token-level preemptive scheduling (Andes, §4).

Design note. Every step the policy sees running, waiting and swapped requests as
numpy arrays (`knapsack.View`) over incrementally kept QoE state (`qoe.RequestTable`).
When the system is memory-bound (KV usage >= watermark with requests queued) or
compute-bound (the observed token latency exceeds the most stringent reader's pace) —
selective triggering, §4.2, considered every `solver_interval` steps — it solves the
knapsack of Eq. 5 for each candidate batch size B in [B_min, B_max] (greedy Alg. 1 or
the DP of Appendix C: `knapsack.solve`), keeps the best, and lets the overhead-aware
refiner (§4.3, `refiner.OverheadRefiner`) decide which admission/preemption pairs are
worth their cost. Otherwise it orders the queue by QoE gain per KV block and admits in
that order, through the same refiner (a prefill stalls the running streams); a reader
whose pacer holds more than Δt of text (its gain over Δt is 0) may then be preempted to
admit a queued request (§3.2: the scheduler and the token pacer are one design). With
`chunked_prefill=False` steps are prefill-first as in vLLM v0, where Andes is
implemented (§5): the chosen victims are preempted, the chosen waiting and swapped
requests admitted in priority order until one does not fit (Algorithm 1's `break`), and
only if no prefill was scheduled every running request advances by one token, the
lowest-priority one preempted when blocks run dry — the shared loops of `phases.py`.
With chunked prefill (the default; issue 14) the same decision is carried out as vLLM
v1 / Sarathi-Serve steps: the running requests advance first, the admissions then take
prefill chunks from what is left of the step's token budget, so a long prompt no longer
stalls every stream for its whole prefill. The helpers (`qoe`, `knapsack`, `refiner`,
`phases`) never call back into the policy: one decision reads top to bottom here.

The simulator's fast paths (`SimFastPath`, andante.engine.fast_path; Andes §4.2
selective triggering and §3.1 the request tracker, replayed). Decode runs: with nothing
queued the decision is "decode every running request" until an arrival, a finish or a
block shortage, whatever the time, so the policy declares itself `stationary` then and
replays, when the run ends, what `on_step_end` and its selective-triggering count would
have recorded for the steps the simulator applied at once (bit-identical state; tests
compare both modes). Without the refiner (LQSF) it is stationary too, leaving the
admission watermark free (see `_declare_stationary`). Prefill runs are replayed alike:
the decodes' tokens, the prompt chunks' latency observations and the triggering count
(`_declare_queued_run` says when a queued step's successors decide the same).
`decode_order` and `decode_budget` serve the runs that follow a finish.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.fast_path import FastPathDefaults
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy, PolicyContext
from andante.engine.stopping import num_tokens_before_length_stop
from andante.exec.batch import StepBatch, StepResult
from andante.kv.block_manager import max_new_blocks_for
from andante.policies.andes.knapsack import (
    RUNNING,
    STARVED,
    LatencyModel,
    QueueRanking,
    Solution,
    View,
    ascending,
    solve,
    starvation,
)
from andante.policies.andes.options import AndesOptions
from andante.policies.andes.qoe import RequestTable, qoe_gain
from andante.policies.andes.refiner import OverheadRefiner
from andante.policies.phases import (
    TokenCount,
    admit_and_swap_in,
    advance_with_preemption,
    budgeted,
    decodes_first,
    empties_queue,
    remaining_tokens,
    running_fill_budget,
    schedules_prompt_chunk,
)

_NUM_COMPUTED = attrgetter("num_computed_tokens")
_BUFFER_MARGIN = 1e-6  # seconds: a pacer-buffer bound's margin over rounding
_PRIORITY_GAP = 1e-6  # seconds of starvation: a lead that rounding never closes


@dataclass(slots=True)
class AndesStats:
    num_solves: int = 0  # knapsack invocations (selective triggering let them run)


@dataclass(slots=True)
class Decision:
    admits: list[Request] = field(default_factory=list)  # in the order to try
    victims: list[Request] = field(default_factory=list)  # preempt now
    decode_order: list[Request] = field(default_factory=list)  # highest priority first
    #: the admissions past `admits`, computed when all of `admits` got in (`_carry_out`)
    rest: Callable[[], list[Request]] | None = None


class AndesPolicy(BasePolicy, FastPathDefaults):
    name = "andes"
    Options = AndesOptions
    chunks_prefill = AndesOptions().chunked_prefill  # per instance: the option's value
    #: `on_arrival` only gives the new request a table slot of its own, which no run's
    #: replay reads or writes (and a run's only finishes are at its end), so a run may
    #: end with the step that straddles an arrival (andante.sim.simulator `_straddles`).
    arrivals_commute_with_runs = True

    @classmethod
    def preemption_options(cls, mode: PreemptionMode) -> dict[str, Any]:
        """A fixed mechanism instead of the per-request cheaper one (§4.3)."""
        return {"preemption": "swap" if mode == PreemptionMode.SWAP else "recompute"}

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._init_state()
        self._init_runs()

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
        self.refiner = OverheadRefiner(self.options, self.latency, self.refine_admissions)
        self.stats = AndesStats()
        self._since_solve = self.options.solver_interval
        self._prefilling = False  # the last step scheduled a prompt chunk

    def _init_runs(self) -> None:
        self.stationary = False  # see `_declare_stationary`
        self.decode_run_reserve_blocks = 0  # the watermark, without the refiner (`schedule`)
        self._run_min_inv = 0.0  # the running requests' least 1/tds when a run began
        self._run_token_budget = 0  # the token budget of the steps a run stands for
        self._queued_run = False  # see `_declare_queued_run`
        self.run_step_limit = math.inf
        self._queued_decodes = False  # see `_declare_queued_decodes`
        self._run_solves_at_due = False  # (its runs' knapsack, due, decides nothing)
        self._run_steps: float = math.inf  # (its bounds, counted down by runs)
        self._run_steps_before_due: float = math.inf
        self.run_until = math.inf

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
            self.stationary = self._queued_decodes = False
            self._run_steps = self._run_steps_before_due = self.run_until = math.inf
        self._run_solves_at_due = False
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
        elif self._prefilling:
            self._declare_queued_run(plan, view)
        else:
            self._declare_queued_decodes(plan, view)

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
        # may the next tokens (a block each, the prompt chunks the budget allows) run short?
        if plan.num_free_blocks < len(running) + plan.max_new_blocks_for(plan.token_budget):
            decode_order = [running[i] for i in ascending(self.table.buffered(idx, plan.now))]
        else:  # every request finds its blocks: the order decides nothing
            decode_order = list(running)
        num_tokens: TokenCount = remaining_tokens
        if self.chunks_prefill:
            num_tokens = budgeted(plan)
            if self._prefilling:
                decode_order = decodes_first(decode_order)
        advance_with_preemption(plan, decode_order, num_tokens,
                                partial(self.refiner.mode_for, plan))
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

    def _triggered(self, plan: StepPlan, view: View) -> bool:
        """Selective triggering (§4.2)."""
        if self._since_solve < self.options.solver_interval or not view.num_running:
            return False
        if plan.kv_usage >= self.options.watermark and len(view) > view.num_running:
            return True
        return self.latency.token_latency > float(view.streams.inv.min())

    # ---- the knapsack (§4.2) and the refiner (§4.3) ---------------------------------
    def _solve(self, plan: StepPlan, view: View) -> Decision:
        """The knapsack's best B over M, what the running requests hold plus the free
        blocks, less the block manager's admission watermark. Its chosen queued
        requests become admissions in priority order, its unchosen running ones
        candidate victims from the lowest priority up. Without the refiner every victim
        is preempted, as the knapsack decided; with it, a victim that no kept admission
        needs the memory of keeps running (pausing it would hold its KV and its sequence
        slot while serving nobody)."""
        nr = view.num_running
        capacity = plan.num_free_blocks_above_watermark + float(view.weight[:nr].sum())
        starved = starvation(view, plan.now, self.starvation_limit)
        best: Solution = solve(view, self.latency, self.options, capacity,
                               plan.config.max_num_seqs, plan.now, starved)
        prio, chosen = best.priority, best.packing.chosen
        selected = np.zeros(len(view), dtype=bool)
        selected[chosen] = True
        admits = chosen[view.kind[chosen] != RUNNING]
        dropped = np.flatnonzero(~selected[:nr])
        victims = dropped[np.argsort(prio[dropped], kind="stable")]
        admit_reqs, victim_reqs = self.refiner.refine(plan, view, admits, victims,
                                                      best.gain, best.tau, starved)
        if not self.options.refiner:
            cap = self.options.max_preemptions
            victim_reqs = [view.reqs[i] for i in (victims if cap is None else victims[:cap])]
        decode = np.argsort(-prio[:nr], kind="stable")
        return Decision(admit_reqs, victim_reqs, [view.reqs[i] for i in decode])

    # ---- between solves: cheap ordering, pacer-aware preemption ---------------------
    def _order_queue(self, plan: StepPlan, view: View) -> Decision:
        """Decode the emptiest pacer buffers first; admit the queue by priority (its
        scores are computed only where they decide something, `ranking.QueueRanking`:
        a lone queued request, or a starved one, is first whatever the gains; past the
        first, the order matters only if the first is admitted or the refiner weighs
        the pairs)."""
        now, nr = plan.now, view.num_running
        buffered = view.streams.buffered(now, nr)
        by_need = ascending(buffered)  # emptiest buffers first
        reqs = view.reqs
        decision = Decision(decode_order=[reqs[i] for i in by_need])
        if len(view) == nr or self._admits_nobody(plan, view, buffered):
            return decision
        o = self.options
        ranking = QueueRanking(view, o, plan.config.max_num_seqs,
                               starvation(view, now, self.starvation_limit),
                               partial(self._queue_scores, plan, view))
        first = ranking.first
        decision.admits = [reqs[first]]
        victims = np.empty(0, dtype=np.intp)
        fits = (o.pacer_aware or o.pause_buffered_s > 0) and self._fits(plan, reqs[first])
        if o.pacer_aware and not fits:
            most = np.array(by_need[::-1], dtype=np.intp)
            victims = most[buffered[most] > o.delta_t]  # most buffered first, gain 0 over Δt
        elif fits and o.pause_buffered_s > 0 and self._admits_all(plan, view):
            decision.decode_order = [view.reqs[i] for i in by_need
                                     if buffered[i] <= o.pause_buffered_s]
        if len(victims) or (o.refiner and self.refine_admissions and nr):
            budget = self.refiner.slack_budget(plan, view)
            if self._refiner_pairs_nobody(plan, view, first, budget):
                decision.admits = []
                return decision
            tau, gain, starved = ranking.scores()
            gains = np.zeros(len(view))
            gains[view.queued] = gain
            decision.admits, decision.victims = self.refiner.refine(
                plan, view, ranking.order(), victims, gains, tau, starved, budget)
        elif fits or not self.chunks_prefill:
            decision.admits = [reqs[i] for i in ranking.order()]
        else:  # the first is tried after the decodes; the rest only if it is admitted
            decision.rest = lambda: [reqs[i] for i in ranking.order()[1:]]
        return decision

    def _refiner_pairs_nobody(self, plan: StepPlan, view: View, first: int,
                              budget: float) -> bool:
        """Does the refiner keep no pair, whatever the order past `first`? So when it
        has no slack to spend (it drops every victim, `OverheadRefiner.refine`), weighs
        no admission that preempts nobody, and the first does not fit in the free
        blocks beside the watermark (`refiner.pair_up` stops at it)."""
        if not self.options.refiner or self.refine_admissions or budget > 0.0:
            return False
        return plan.num_free_blocks_above_watermark < float(view.weight[first])

    def _queue_scores(self, plan: StepPlan, view: View) -> tuple[float, np.ndarray]:
        """τ at the current batch size and the queued requests' gains."""
        nr = view.num_running
        tau = self.latency.tau(max(1, nr))
        queued = view.queued  # (a slice: views of the arrays, no gathers)
        gain = qoe_gain(view.streams.select(queued), plan.now, self.options.delta_t,
                        view.base[queued] + view.step[queued] * tau, tau,
                        self.options.objective, view.streams)
        return float(tau), gain

    def _admits_nobody(self, plan: StepPlan, view: View, buffered: np.ndarray) -> bool:
        """With chunked prefill, True when the running requests' remaining tokens fill
        the step's token budget (nobody queued can be admitted, whatever the order) and
        no admission could pair with a victim: no pacer holds more than Δt, or every
        queued request fits in the free memory. The decision is then the decode order
        alone, so the gains are not computed (the simulator's queued steps during a
        long prompt's chunks)."""
        if not (self.chunks_prefill and self._prefilling):  # else all decode: budget left
            return False
        if not running_fill_budget(plan):
            return False
        o = self.options
        if not o.pacer_aware or not bool((buffered > o.delta_t).any()):
            return True
        num_queued = len(view) - view.num_running
        return num_queued <= plan.config.max_num_seqs and self._queue_fits(plan, view)

    @staticmethod
    def _queue_fits(plan: StepPlan, view: View) -> bool:
        """Do all the queued requests' blocks fit in the free ones above the watermark?"""
        free = plan.num_free_blocks_above_watermark
        return float(view.weight[view.queued].sum()) <= free

    def _admits_all(self, plan: StepPlan, view: View) -> bool:
        """With chunked prefill: can every queued request join the running ones now
        (half the sequence slots at most, free blocks beside the watermark, a token
        budget that running prompt chunks do not fill)? Only then may buffered streams
        sit a step out (`pause_buffered_s`): when the queue waits for slots or memory,
        slowing the streams that free them would make it wait longer (simulated at
        3 req/s, pausing up to the full slot count cost mean QoE 0.991 -> 0.984)."""
        if not self.chunks_prefill or 2 * len(view) > plan.config.max_num_seqs:
            return False
        if self._prefilling and running_fill_budget(plan):
            return False  # running chunks take the step: as `_admits_nobody`
        return self._queue_fits(plan, view)

    @staticmethod
    def _fits(plan: StepPlan, req: Request) -> bool:
        n = req.num_uncomputed_tokens
        if req.status == RequestStatus.SWAPPED:
            return plan.can_swap_in(req, n)
        return plan.can_schedule(req, n)

    # ---- carrying a decision out through the shared loops (phases.py) --------------
    def _carry_out(self, plan: StepPlan, decision: Decision) -> None:
        """Preempt the victims; then, prefill-first (vLLM v0, Andes §5): admit in
        priority order and, if no prefill was scheduled, advance the running requests;
        chunked (vLLM v1 / Sarathi-Serve): advance the running requests first, the
        admissions then take prefill chunks from what is left of the token budget."""
        mode_for = partial(self.refiner.mode_for, plan)
        for victim in decision.victims:
            if plan.can_preempt(victim, PreemptionMode.RECOMPUTE):
                plan.preempt(victim, mode_for(victim))
        if not self.chunks_prefill:
            if not admit_and_swap_in(plan, decision.admits):
                advance_with_preemption(plan, decision.decode_order, remaining_tokens,
                                        mode_for)
            return
        num_tokens = budgeted(plan)  # running requests first, then the admissions
        preempted = len(plan.preemptions)
        advance_with_preemption(plan, decodes_first(decision.decode_order), num_tokens,
                                mode_for)
        if len(plan.preemptions) == preempted:
            admit_and_swap_in(plan, decision.admits, num_tokens)
            if decision.rest is not None and all(map(plan.is_scheduled, decision.admits)):
                admit_and_swap_in(plan, decision.rest(), num_tokens)  # (as in one list)
        self._prefilling = schedules_prompt_chunk(plan)

    # ---- the simulator's fast paths (SimFastPath, see the module note) --------------
    def _declare_stationary(self, plan: StepPlan, min_inv: float) -> None:
        """With nothing queued, every step decodes every running request until an
        arrival, a finish or a block shortage (the events that end a decode run): the
        knapsack may run (compute-bound trigger) but, with the refiner, it preempts
        nobody when nobody is admitted. Time and QoE state then only feed bookkeeping,
        which `on_decode_run` replays for the steps a run applied at once. Without the
        refiner (LQSF) the knapsack's unchosen requests are preempted, but with nothing
        queued and B = B_max (no batch search) it chooses every running request while
        the free blocks cover the admission watermark (its capacity M less their
        weights is free - watermark), so a run must leave the watermark free
        (`decode_run_reserve_blocks`). A step that admits the whole queue is followed by
        such steps too (`empties_queue`); `min_inv` is then the least 1/tds of the
        running and admitted requests, whose number sets the next steps' token budget
        (`prefill_run_budget`)."""
        o = self.options
        self.stationary = not plan.preemptions and (o.refiner or (
            not o.batch_search and plan.num_free_blocks_above_watermark > 0))
        if self.stationary:
            self._run_min_inv = min_inv
            num_next = len(plan.running) + len(plan.waiting) + len(plan.swapped)
            self._run_token_budget = self._step_token_budget(num_next)

    def _declare_queued_run(self, plan: StepPlan, view: View) -> None:
        """A chunked step that advanced every running request and admitted nobody while
        requests wait: its next steps decide the same (the decodes, a prompt chunk
        that spends the budget, nobody admitted: `_admits_nobody`) as long as the
        knapsack is not triggered and every queued request fits the free blocks
        beside the watermark (or no pacer counts). So a prefill run may follow
        (`prefill_run_budget`) if it leaves free the blocks those need (the memory
        trigger's share of the device and the queue's weight, as
        `decode_run_reserve_blocks`) and its steps are shorter than every reader's
        pace (`run_step_limit`): the token-latency estimate, an average of the
        steps' gaps, then stays below it (the compute-bound trigger)."""
        o = self.options
        if not (self.chunks_prefill and o.refiner) or plan.preemptions or plan.swapped \
                or len(plan.scheduled) != view.num_running:
            return
        reserve = plan.min_free_blocks_below_usage(o.watermark)
        if o.pacer_aware:
            if len(view) - view.num_running > plan.config.max_num_seqs:
                return
            weight = math.ceil(float(view.weight[view.queued].sum()))
            reserve = max(reserve, plan.watermark_blocks + weight)
        min_inv = float(view.streams.inv.min())
        self._queued_run, self._run_min_inv = True, min_inv
        self._run_token_budget = self._step_token_budget(view.num_running)
        self.decode_run_reserve_blocks = reserve
        self.run_step_limit = min_inv * (1.0 - 1e-9)  # (a margin over rounding)

    def _declare_queued_decodes(self, plan: StepPlan, view: View) -> None:
        """A chunked step that decoded every running request, admitted nobody and
        preempted nobody while requests wait (memory pressure: the queue waits for
        blocks): its next steps decide the same (`_order_queue`: the decodes, nobody
        admitted, no victim) while
        (1) the request first in line (or, where the gains decide who that is, every
        queued one) is not admitted, nor paired by the refiner (`_queue_stays_out`;
        `StepPlan.admits_none_of`: the free blocks only shrink in a decode run, and
        nothing is registered that a waiting request's hit could grow by), and the
        pause of buffered streams does not apply (`_fits` fails for it);
        (2) the knapsack is not triggered: until it is due (`solver_interval`), or,
        once due, while the run leaves the usage below the memory trigger's watermark
        (`decode_run_reserve_blocks`) and every step is shorter than the most
        stringent reader's pace, so the token-latency estimate, an average of the
        steps' gaps that is below it now, stays below it (`run_step_limit`); or it is
        triggered at every due step (the usage is at the watermark already and only
        grows, with requests queued) and decides nothing (`_solves_change_nothing`),
        which the replay counts (`_replay_schedules`);
        (3) with the pacer-aware preemption, no victim is kept: either the refiner's
        slack budget stays <= 0 (`_budget_stays_spent`: it then drops every victim),
        or no running reader's buffer exceeds Δt (a token adds at most 1/tds to it:
        the reader's schedule moves on by 1/tds, a late token resets it to 0; so after
        j more tokens it is at most its value now plus j/tds).
        No decision reads the gains then, so none is computed for these steps.
        `stationary` then holds for the `run_max_steps` steps these bounds give, which
        `on_decode_run` counts down, and which (4) end before a step that finishes a
        request (the decode order, the pacer buffers', may change from step to step:
        it decides only the order of a step's finishes, and who is preempted at a block
        shortage, which ends a run)."""
        o = self.options
        nr = view.num_running
        if not (self.chunks_prefill and o.refiner) or self.refine_admissions or not nr:
            return
        if plan.preemptions or plan.swap_ins or len(plan.scheduled) != nr:
            return
        if any(req.status != RequestStatus.RUNNING for req in plan.scheduled):
            return
        before_due = o.solver_interval - 1 - self._since_solve
        min_inv = float(view.streams.inv.min())
        reserve = plan.min_free_blocks_below_usage(o.watermark)
        # never triggered (2) if the usage stays below the watermark; the latency
        # estimate is read when a run would start (`run_max_steps`)
        steps: float = math.inf if plan.num_free_blocks > reserve else before_due
        solves_at_due = steps < math.inf and self._solves_change_nothing(plan, view)
        if solves_at_due:
            steps = math.inf
        if steps < 1:
            return
        # (4) a run ends before a request finishes: the finishing step decodes in its
        # own pacer order (its finishes' order), which may differ from this step's
        steps = min(steps, num_tokens_before_length_stop(plan.running,
                                                         plan.max_num_tokens) - 2)
        stays_out = self._queue_stays_out(plan, view) if steps >= 1 else None
        if stays_out is None or min(steps, stays_out[0]) < 1:
            return
        steps, self.run_until = min(steps, stays_out[0]), stays_out[1]
        self.stationary = self._queued_decodes = True
        self._run_solves_at_due = solves_at_due
        self._run_steps, self._run_steps_before_due = steps, before_due
        self._run_min_inv = min_inv
        if plan.num_free_blocks > reserve:
            self.decode_run_reserve_blocks = reserve
            self.run_step_limit = min_inv * (1.0 - 1e-9)  # (a margin over rounding)

    def _solves_change_nothing(self, plan: StepPlan, view: View) -> bool:
        """Is the knapsack triggered at each of a decode run's due steps, deciding
        nothing there? The memory trigger fires when due: the usage is at the watermark
        now and only grows in a decode run, and requests stay queued. Its decision
        (`_solve`) admits nobody and preempts nobody, whatever the packing: the
        refiner's slack budget stays spent (`_budget_stays_spent`), so it drops every
        victim, and no queued request fits in the free blocks beside the watermark
        (their weights do not change while they wait; the free blocks only shrink), so
        `refiner.pair_up` stops at the first admission; or, with the greedy solver
        (Algorithm 1), the request first in line whatever the gains (`_first_in_line`,
        a starved lead, first in every candidate batch's packing order) does not fit
        there: the packing either stops before it (nothing chosen) or starts with it.
        Its decode order by priority decides nothing in a run either (no block
        shortage, no finish)."""
        o = self.options
        if plan.kv_usage < o.watermark or not self._budget_stays_spent(plan, view):
            return False
        free = plan.num_free_blocks_above_watermark
        if float(view.weight[view.queued].min()) > free:
            return True
        first = self._first_in_line(plan, view) if o.solver == "greedy" else None
        return first is not None and float(view.weight[first]) > free

    @property
    def run_max_steps(self) -> float:
        """The steps of decode runs that may follow while requests wait
        (`_declare_queued_decodes`): past the knapsack's due step only while the
        token-latency estimate (the last step's gap included) is below every reader's
        pace, and the run's steps are (`run_step_limit`, with the watermark's reserve)."""
        if not self._queued_decodes or self.latency.token_latency <= self.run_step_limit:
            return self._run_steps
        return min(self._run_steps, self._run_steps_before_due)

    def _queue_stays_out(self, plan: StepPlan, view: View) -> tuple[float, float] | None:
        """For how many steps, and until when, the decisions of steps that only decode
        the running requests admit nobody and preempt nobody ((1) and (3) of
        `_declare_queued_decodes`); None: not sure. Only the first queued request in
        priority order is ever tried (admissions stop at the first that does not fit;
        the refiner pairs in that order and stops alike): which one is known without
        the gains when a queued request is starved (`_first_in_line`); else every
        queued request must qualify. Either the first gets no token's blocks, and no
        victim is kept (the refiner's budget stays spent, or no pacer passes Δt: a
        number of steps), or, with the budget spent, it fits neither whole (its blocks
        or the token budget refuse it: `_fits` fails, so the pacer-aware branch runs)
        nor in the free blocks beside the watermark (so the refiner pairs it with
        nobody), while some pacer holds more than Δt (a victim, so the refiner
        decides): until a time, as a buffer shrinks at most by the time passed (each
        token adds 1/tds to what its reader has, `qoe.RequestTable.record`)."""
        o = self.options
        nr = view.num_running
        first = self._first_in_line(plan, view)
        if first is None:
            queued, positions = [*plan.waiting, *plan.swapped], view.queued
        else:
            queued, positions = [view.reqs[first]], slice(first, first + 1)
        running = plan.running
        spent = o.pacer_aware and self._budget_stays_spent(plan, view)
        if plan.admits_none_of(queued, running):
            if not o.pacer_aware or spent:
                return math.inf, math.inf
            room = o.delta_t - _BUFFER_MARGIN - view.streams.buffered(plan.now, nr)
            return math.floor(float((room / view.streams.inv[:nr]).min())), math.inf
        budget = self._step_token_budget(nr)  # (the budget `_fits` reads)
        if not spent or not plan.admits_none_of(queued, running, whole_within=budget):
            return None
        if float(view.weight[positions].min()) <= plan.num_free_blocks_above_watermark:
            return None
        most = float(view.streams.buffered(plan.now, nr).max())
        until = plan.now + (most - o.delta_t) - _BUFFER_MARGIN
        return (math.inf, until) if until > plan.now else None

    def _first_in_line(self, plan: StepPlan, view: View) -> int | None:
        """The view position of the queued request first in priority order whatever
        the gains, now and while time passes with the queue unchanged: the one that
        has waited longest past the starvation limit (`knapsack.priority`: STARVED plus
        the wait, above any gain per block, a QoE difference of at most 1), if it leads
        the next by more than rounding could ever close; None if nobody is starved."""
        starved = starvation(view, plan.now, self.starvation_limit)
        if starved is None:
            return None
        waits = starved[view.num_running:]
        best = int(np.argmax(waits))
        if not waits[best] > 0:
            return None
        prio = STARVED + waits  # (as `knapsack.priority` computes it)
        if len(prio) > 1 and float(np.partition(prio, -2)[-2]) > prio[best] - _PRIORITY_GAP:
            return None  # a near tie: rounding at a later time could reorder them
        return view.num_running + best

    def _budget_stays_spent(self, plan: StepPlan, view: View) -> bool:
        """Does the refiner's slack budget (§4.3: a low percentile of every viewed
        request's slack, `OverheadRefiner.slack_budget`) stay <= 0 while only the
        running requests get tokens? A queued request's slack only shrinks as time
        passes (a running one's may grow), so it does if more queued requests than the
        percentile's rank have none left now."""
        q = self.options.slack_percentile
        if q >= 1.0:
            return False
        size = len(view)
        rank = min(size - 1, int(q * size))
        s = view.streams.select(view.queued)
        slack = s.start + s.n * s.inv + np.maximum(s.late, 0.0) - plan.now
        return int(np.count_nonzero(slack <= 0.0)) > rank

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None:
        """What `on_step_end` and `schedule` would have recorded for each step of a
        decode run: the tokens' QoE state, the latency estimates and the solver's
        selective-triggering count (the knapsack it would run changes nothing). The
        policy stays stationary: another run may follow at once."""
        reqs = batch.requests
        times = self.latency.run_times(reqs[0].timeline.token_times) if reqs else []
        if not times:
            return
        self._run_steps -= len(times)
        self._run_steps_before_due -= len(times)
        self._record_run(reqs, times)
        # each request holds its tokens at the run's end less one per step of the run
        context = sum(map(_NUM_COMPUTED, reqs)) - len(reqs) * len(times)
        self._prefilling = False  # (a run that follows a prefill, andante.sim.after_finish)
        self._replay_schedules(self.latency.observe_run(times, len(reqs), context))

    def on_prefill_run(self, batch: StepBatch, chunks: Sequence[int],
                       times: Sequence[float], durations: Sequence[float] = ()) -> None:
        """What `on_step_end` and `schedule` would have recorded for each step of a
        prefill run (andante.sim.prefill_run): `batch`'s decodes got a token per step,
        its last request prefilled `chunks` (its first token at the end if the prompt is
        done). A final chunk of one token counts as a decode, as `LatencyModel.observe`
        counts it."""
        *decodes, prefill = batch.requests
        self._record_run(decodes, times)
        token_times = prefill.timeline.token_times
        if token_times and token_times[-1] == times[-1]:  # the prompt's first token
            self._record_run([prefill], times[-1:])
        num_dec, steps = len(decodes), len(chunks)
        context = sum(map(_NUM_COMPUTED, decodes)) - num_dec * steps
        cached = prefill.num_computed_tokens - sum(chunks)
        latency, before = self.latency, []
        for chunk, now in zip(chunks, times, strict=True):
            before.append(latency.token_latency)
            if chunk == 1:  # (never 0 cached: the run continues a prefill)
                latency.observe_decodes(num_dec + 1, context + cached, now)
            else:
                latency.observe_decodes(num_dec, context, now)
            context += num_dec
            cached += chunk
        self._prefilling = chunks[-1] > 1
        self._replay_schedules(before)

    def _record_run(self, reqs: Sequence[Request], times: Sequence[float]) -> None:
        """A token at each of `times` for each of `reqs` still tracked (one that
        finished is not)."""
        table = self.table
        slots = table.slots_of(reqs)
        if not slots:
            return
        if table.few_records(len(slots), len(times)):
            table.record_few(slots, times)
        else:
            table.record_run(np.array(slots, dtype=np.intp), np.array(times))

    def _replay_schedules(self, latencies: Sequence[float]) -> None:
        """The selective-triggering count of the steps of a run, whose token latency
        estimates at their decisions were `latencies`: with nothing queued the knapsack
        it would run preempts nobody (see `_declare_stationary`); in a queued decode
        run past its due step, the memory trigger fires whenever the knapsack is due,
        and it decides nothing (`_solves_change_nothing`)."""
        interval, min_inv = self.options.solver_interval, self._run_min_inv
        at_due = self._run_solves_at_due
        for latency in latencies:
            self._since_solve += 1
            if self._since_solve >= interval and (at_due or latency > min_inv):
                self._since_solve = 0
                self.stats.num_solves += 1

    @property
    def prefill_run_budget(self) -> int:
        """With chunked prefill and the refiner, the next steps' token budget: with
        nothing queued (`stationary`) every running request advances, the decodes
        first, and a prompt's chunk takes what is left (andante.sim.prefill_run); so
        while a chunk spends the budget with requests queued, if the token-latency
        estimate is below every reader's pace (`_declare_queued_run`)."""
        if not (self.chunks_prefill and self.options.refiner) or self._queued_decodes:
            return 0
        if self.stationary or (self._queued_run and self._prefilling and (
                self.latency.token_latency <= self.run_step_limit)):
            return self._run_token_budget
        return 0

    @property
    def decode_budget(self) -> int:
        """With nothing queued, every running request decodes (andante.sim.after_finish)
        in the order `decode_order` gives, where the knapsack cannot preempt: with the
        refiner, or without the batch search (see `_declare_stationary`)."""
        o = self.options
        return self.ctx.config.max_num_batched_tokens if o.refiner or not o.batch_search \
            else 0

    def decode_order(self, running: Sequence[Request],
                     num_free_blocks: int) -> Sequence[Request] | None:
        """The order `_decode_all` decodes every running request in, with nothing
        queued; None when the knapsack is due (its order is the priorities'). Keeps
        the requests' least 1/tds for the run's replay."""
        idx = self.table.indices(running)
        min_inv = float(self.table.inv[idx].min())
        if self._since_solve + 1 >= self.options.solver_interval and (
                self.latency.token_latency > min_inv):
            return None
        self._run_min_inv = min_inv
        budget = self._step_token_budget(len(running))
        block_size = self.ctx.config.block_size
        if num_free_blocks >= len(running) + max_new_blocks_for(budget, block_size):
            return running
        order = np.argsort(self.table.buffered(idx, self.now), kind="stable")
        return [running[i] for i in order]
