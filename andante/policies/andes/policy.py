"""`andes`: QoE-aware token-level preemptive scheduling (Andes, §4).

Design note. Every step the policy sees running, waiting and swapped requests as
numpy arrays (`View`) over incrementally kept QoE state (`state.py`). When the system
is memory-bound (KV usage >= watermark with requests queued) or compute-bound (the
observed token latency exceeds the most stringent reader's pace) — selective
triggering, §4.2, considered every `solver_interval` steps — it solves the knapsack of
Eq. 5 for each candidate batch size B in [B_min, B_max] (greedy Alg. 1 or the DP of
Appendix C), keeps the best, and lets the overhead-aware refiner (§4.3) decide which
admission/preemption pairs are worth their cost. Otherwise it orders the queue by QoE
gain per KV block and admits in that order, through the same refiner (a prefill stalls
the running streams); a reader whose pacer holds more than Δt of text (its gain over Δt
is 0) may then be preempted to admit a queued request (§3.2: the scheduler and the
token pacer are one design). Steps are prefill-first as in vLLM, where Andes is
implemented (§5).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy, PolicyContext
from andante.exec.batch import StepBatch, StepResult
from andante.policies.andes import execute
from andante.policies.andes.decision import AndesStats, Decision
from andante.policies.andes.gain import Streams, objective_gain, qoe_at
from andante.policies.andes.knapsack import top_order
from andante.policies.andes.latency import LatencyModel
from andante.policies.andes.options import AndesOptions
from andante.policies.andes.refiner import accepted_prefix, pair_up
from andante.policies.andes.solve import solve_knapsack
from andante.policies.andes.state import RequestTable
from andante.policies.andes.view import RUNNING, View

RUNNING_TIE = 1e-12  # running requests win ties (a zero-gain request costs nothing kept)


class AndesPolicy(BasePolicy):
    name = "andes"
    Options = AndesOptions

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._init_state()

    def _init_state(self) -> None:
        self.table = RequestTable()
        self.latency = LatencyModel(self.ctx.cost_model, self.ctx.config,
                                    self.options.latency_ema)
        self.stats = AndesStats()
        self._since_solve = self.options.solver_interval

    # ---- hooks ----------------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        self.table.add(req)

    def on_finish(self, req: Request) -> None:
        self.table.remove(req)

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None:
        now = self.now
        tokens = result.sampled_token_ids
        got = [req for i, req in enumerate(batch.requests)
               if batch.samples[i] and tokens[i] is not None]
        slots = self.table.slots_of(got)
        if slots:
            self.table.record(np.array(slots, dtype=np.intp), now)
        self.latency.observe(batch, result, now)

    # ---- one step -------------------------------------------------------------------
    def schedule(self, plan: StepPlan) -> None:
        self._since_solve += 1
        if not (plan.running or plan.waiting or plan.swapped):
            return
        view = View.of(self.table, plan, self.latency)
        if self._triggered(plan, view):
            self._since_solve = 0
            self.stats.num_solves += 1
            decision = self._solve(plan, view)
        else:
            decision = self._order_queue(plan, view)
        self._carry_out(plan, decision)

    def _triggered(self, plan: StepPlan, view: View) -> bool:
        """Selective triggering (§4.2)."""
        if self._since_solve < self.options.solver_interval or not view.num_running:
            return False
        used = 1.0 - plan.num_free_blocks / max(1, plan.num_total_blocks)
        if used >= self.options.watermark and len(view) > view.num_running:
            return True
        return self.latency.token_latency > float(view.streams.inv.min())

    def _carry_out(self, plan: StepPlan, decision: Decision) -> None:
        self.stats.num_preemptions += execute.preempt(plan, decision.victims, self._mode_for)
        chosen = len(plan.preemptions)
        if not execute.admit(plan, decision.admits):
            execute.decode(plan, decision.decode_order, self._mode_for)
        self.stats.num_shortage_preemptions += len(plan.preemptions) - chosen

    def _mode_for(self, plan: StepPlan, req: Request) -> PreemptionMode:
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

    # ---- gains ----------------------------------------------------------------------
    def gain(self, s: Streams, now: float, first: np.ndarray, tau: np.ndarray,
              view: View) -> np.ndarray:
        t = now + self.options.delta_t
        q_wait = qoe_at(s, now, t)
        q_serve = qoe_at(s, now, t, first, tau)
        objective = self.options.objective
        if objective == "avg":
            return objective_gain(objective, q_serve, q_wait, q_wait)
        q_now = qoe_at(s, now, now)
        q_min = float(qoe_at(view.streams, now, now).min())
        return objective_gain(objective, q_serve, q_wait, q_now, q_min)

    def priority(self, gain: np.ndarray, weight: np.ndarray, kind: np.ndarray) -> np.ndarray:
        """Eq. 6: gain per KV block (gain alone if not size-aware); running bonus."""
        p = gain / weight if self.options.size_aware else np.array(gain, dtype=float)
        running = kind == RUNNING
        return np.where(running, p * (1.0 + self.options.running_bonus) + RUNNING_TIE, p)

    # ---- between solves: cheap ordering, pacer-aware preemption ---------------------
    def _order_queue(self, plan: StepPlan, view: View) -> Decision:
        now, nr = plan.now, view.num_running
        buffered = self.table.buffered(view.idx[:nr], now)
        by_need = np.argsort(buffered, kind="stable")  # emptiest buffers first
        decision = Decision(decode_order=[view.reqs[i] for i in by_need])
        if len(view) == nr:
            return decision
        tau = self.latency.tau(max(1, nr))
        q = view.queued
        gain = self.gain(view.subset(np.arange(nr, len(view))), now,
                          view.first_delay(tau)[q], tau, view)
        prio = self.priority(gain, view.weight[q], view.kind[q])
        cap = plan.config.max_num_seqs
        order = top_order(prio, cap) + nr
        decision.admits = [view.reqs[i] for i in order]
        o = self.options
        victims = by_need[:0]
        if o.pacer_aware and not self._fits(plan, decision.admits[0]):
            full = buffered[by_need[::-1]] > o.delta_t
            victims = by_need[::-1][full]  # most buffered first, gain 0 over Δt
        if len(victims) or (o.refiner and o.refine_admissions and nr):
            gains = np.zeros(len(view))
            gains[q] = gain
            decision.admits, decision.victims = self.refine(
                plan, view, order, victims, gains, float(tau))
        return decision

    @staticmethod
    def _fits(plan: StepPlan, req: Request) -> bool:
        n = req.num_uncomputed_tokens
        if req.status == RequestStatus.SWAPPED:
            return plan.num_blocks_of(req) + plan.blocks_needed(req, n) <= plan.num_free_blocks
        return plan.can_schedule(req, n)

    # ---- solver and refiner ---------------------------------------------------------
    def _solve(self, plan: StepPlan, view: View) -> Decision:
        return solve_knapsack(self, plan, view)

    def refine(self, plan: StepPlan, view: View, admits: np.ndarray, victims: np.ndarray,
               gain: np.ndarray, tau: float) -> tuple[list[Request], list[Request]]:
        """§4.3 over view positions (admissions best first, victims worst first)."""
        o = self.options
        budget = self._slack_budget(plan, view) if o.refiner else float("inf")
        if budget <= 0.0:
            victims = victims[:0]  # no slack to spend: admit only into free memory
        elif o.max_preemptions is not None:
            victims = victims[: o.max_preemptions]
        reqs = view.reqs
        victim_reqs = [reqs[i] for i in victims]
        modes = self._modes(plan, victim_reqs)
        reserve = int(plan.config.watermark * plan.num_total_blocks)
        pairs = pair_up(view.weight[admits].tolist(),
                        [plan.num_blocks_of(v) for v in victim_reqs],
                        plan.num_free_blocks - reserve)
        keep = len(pairs)
        if o.refiner and pairs and (o.refine_admissions or any(p.victims for p in pairs)):
            tokens = view.weight[victims] * plan.block_size
            swapped = np.array([m == PreemptionMode.SWAP for m in modes], dtype=bool)
            round_trip = np.where(swapped, 2.0 * self.latency.swap_time(tokens),
                                  self.latency.prefill_time(tokens))
            keep = accepted_prefix(pairs, gain[admits], view.base[admits], gain[victims],
                                   round_trip, self._loss_fn(plan, view, victims, tau),
                                   budget, check_all=o.refine_admissions)
        self.stats.num_pairs_kept += keep
        self.stats.num_pairs_cancelled += len(pairs) - keep
        kept = pairs[:keep]
        return ([reqs[admits[p.admit]] for p in kept],
                [victim_reqs[v] for p in kept for v in p.victims])

    def _slack_budget(self, plan: StepPlan, view: View) -> float:
        """Seconds of overhead the ongoing requests tolerate (a low slack percentile)."""
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
        s = view.subset(np.flatnonzero(keep))
        now, t = plan.now, plan.now + self.options.delta_t
        slack = s.start + s.n * s.inv + np.maximum(s.late, 0.0) - now
        fast = tau <= s.inv
        objective, weight = self.options.objective, self.options.stall_weight
        q_min = float(qoe_at(view.streams, now, now).min()) if objective == "min" else 1.0

        def loss_at(stall: np.ndarray) -> np.ndarray:
            risk = np.flatnonzero((slack < tau + float(stall.max())) | ~fast)
            if not len(risk):
                return np.zeros(len(stall))
            sub = Streams(s.start[risk], s.inv[risk], s.n[risk], s.late[risk], s.pos[risk])
            on_time = qoe_at(sub, now, t, tau, tau)
            late = qoe_at(sub, now, t, tau + stall[:, None], tau)
            q_now = qoe_at(sub, now, now) if objective == "perfect" else on_time
            lost = objective_gain(objective, on_time, late, q_now, q_min)
            return np.asarray(weight * lost.sum(axis=1))

        return loss_at
