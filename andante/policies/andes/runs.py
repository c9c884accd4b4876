"""The simulator's fast paths for `andes`: declaring runs and replaying their state.

Design note (Andes §4.2 selective triggering, §3.1 the request tracker, replayed).
Decode runs (andante.sim.decode_run): with nothing queued the decision is "decode every
running request" until an arrival, a finish or a block shortage, whatever the time, so
the policy declares itself `stationary` then and replays, when the run ends, what
`on_step_end` and its selective-triggering count would have recorded for the steps the
simulator applied at once (bit-identical state; a test compares both modes). Without
the refiner (LQSF) it is stationary too, leaving the admission watermark free (see
`_declare_stationary`). Prefill runs (andante.sim.prefill_run) are replayed alike:
the decodes' tokens, the prompt chunks' latency observations and the triggering count
(`_declare_queued_run` says when a queued step's successors decide the same).
`decode_order` and `decode_budget` serve andante.sim.after_finish.

`RunReplay` is a mixin of `AndesPolicy` (policy.py), not a delegate: its hooks read and
write the policy's QoE table, latency model and triggering count, which the decision
owns, and the simulator calls them on its hot path, where a delegate's extra lookups
would cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from andante.core.request import Request
from andante.engine.plan import StepPlan
from andante.exec.batch import StepBatch
from andante.policies.andes.solver import View

if TYPE_CHECKING:
    from andante.engine.policy import PolicyContext
    from andante.policies.andes.gain import RequestTable
    from andante.policies.andes.latency import LatencyModel
    from andante.policies.andes.options import AndesOptions
    from andante.policies.andes.policy import AndesStats


_NUM_COMPUTED = attrgetter("num_computed_tokens")


class RunReplay:
    """The run declarations and replays of `AndesPolicy` (see the module note)."""

    #: `on_arrival` only gives the new request a table slot of its own, which no run's
    #: replay reads or writes (and a run's only finishes are at its end), so a run may
    #: end with the step that straddles an arrival (andante.sim.simulator `_straddles`).
    arrivals_commute_with_runs = True

    if TYPE_CHECKING:  # the policy's state these hooks share (policy.py)
        ctx: PolicyContext
        options: AndesOptions
        table: RequestTable
        latency: LatencyModel
        stats: AndesStats
        chunks_prefill: bool
        _since_solve: int
        _prefilling: bool

        @property
        def now(self) -> float: ...

        def _step_token_budget(self, num_running: int) -> int: ...

        def _runs_short(self, num_running: int, token_budget: int,
                        num_free_blocks: int) -> bool: ...

    def _init_runs(self) -> None:
        self.stationary = False  # see `_declare_stationary`
        self.decode_run_reserve_blocks = 0  # the watermark, without the refiner (`schedule`)
        self._run_min_inv = 0.0  # the running requests' least 1/tds when a run began
        self._run_token_budget = 0  # the token budget of the steps a run stands for
        self._queued_run = False  # see `_declare_queued_run`
        self.run_step_limit = math.inf

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
        such steps too (`_empties_queue`); `min_inv` is then the least 1/tds of the
        running and admitted requests, whose number sets the next steps' token budget
        (`prefill_run_budget`)."""
        o = self.options
        self.stationary = not plan.preemptions and (o.refiner or (
            not o.batch_search and plan.num_free_blocks > plan.watermark_blocks))
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
        reserve = math.ceil((1.0 - o.watermark) * plan.num_total_blocks) + 1
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

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None:
        """What `on_step_end` and `schedule` would have recorded for each step of a
        decode run: the tokens' QoE state, the latency estimates and the solver's
        selective-triggering count (the knapsack it would run changes nothing). The
        policy stays stationary: another run may follow at once."""
        reqs = batch.requests
        times = self.latency.run_times(reqs[0].timeline.token_times) if reqs else []
        if not times:
            return
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
        it would run preempts nobody (see `_declare_stationary`)."""
        interval, min_inv = self.options.solver_interval, self._run_min_inv
        for latency in latencies:
            self._since_solve += 1
            if self._since_solve >= interval and latency > min_inv:
                self._since_solve = 0
                self.stats.num_solves += 1

    @property
    def prefill_run_budget(self) -> int:
        """With chunked prefill and the refiner, the next steps' token budget: with
        nothing queued (`stationary`) every running request advances, the decodes
        first, and a prompt's chunk takes what is left (andante.sim.prefill_run); so
        while a chunk spends the budget with requests queued, if the token-latency
        estimate is below every reader's pace (`_declare_queued_run`)."""
        if not (self.chunks_prefill and self.options.refiner):
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
        if not self._runs_short(len(running), budget, num_free_blocks):
            return running
        order = np.argsort(self.table.buffered(idx, self.now), kind="stable")
        return [running[i] for i in order]
