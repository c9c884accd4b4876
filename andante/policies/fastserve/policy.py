"""`fastserve` and `fastserve-fcfs`: token-level preemptive scheduling with proactive
KV-cache swapping.

Design note: FastServe (Wu et al., 2023), §4.1-§4.3. Every step the policy
1. promotes jobs idle for α seconds to Q1 (starvation prevention, Alg. 1 line 19);
2. gives the top of the job order places on the device and takes the ready ones that
   fit the step's budgets as the batch (token-level preemption: everything else
   pauses, §4.1; `choice.choose`);
3. makes room, swaps, prefetches and schedules through the plan (§4.2, `kvcache`);
and after the step charges each job of the batch the step's (predicted) duration,
demoting those whose quantum ran out (Alg. 1 line 16). The order is the skip-join MLFQ
(`mlfq.SkipJoinMLFQ`) for `fastserve` and arrival order for `fastserve-fcfs`, the
paper's ablation with the same engine and swapping. A batch mixes prefills with
decodes (iteration-level scheduling, as FastServe's engine). With pipeline
parallelism (§4.3) the scheduler hides jobs of batches still in flight from the plan;
they keep their place in the queues and the next batch takes the best pending jobs.

Decode runs (the simulator's fast path, andante.sim.decode_run): when every job is in
an all-decode batch, nothing waits or is swapped, nothing moved, and the device holds
every job to its last token beside the reserve, the same batch is certain to follow
until an arrival or a finish (the order may change, the batch cannot). The policy then
declares itself `stationary`; `on_decode_run` replays on the job order what the steps
applied at once would have recorded (`SkipJoinMLFQ.replay_decode_run`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.fast_path import FastPathDefaults
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy, PolicyContext
from andante.exec.batch import StepBatch, StepResult
from andante.kv.block_manager import num_blocks_for
from andante.policies.fastserve.choice import choose
from andante.policies.fastserve.churn import ChurnBound
from andante.policies.fastserve.kvcache import KV_MODES, ArrivalRate, KVPlanner
from andante.policies.fastserve.mlfq import FCFSOrder, SkipJoinMLFQ, geometric_quanta

_NO_KV = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
DEFAULT_BASE_QUANTUM = 0.01  # s: FastServe's public code, used without a cost model
DEFAULT_PREFILL_RATE = 20_000.0  # tokens/s: prefill-time guess without a cost model


@dataclass(frozen=True, slots=True)
class FastServeOptions:
    """Tunables (`--policy-option key=value`).

    base_quantum: q1 in seconds; None = the cost model's minimum iteration time.
    quantum_ratio, num_queues: q_k = q1·ratio^(k-1) for k = 1..num_queues.
    starve_limit: α, seconds idle before promotion to Q1; None disables it.
    kv_mode: "proactive" (§4.2), "reactive" (swap only when a step needs the room) or
    "recompute" (drop paused jobs' KV instead of swapping).
    reserve_horizon: seconds of expected arrivals whose prompts the reserve holds.
    reserve_max_fraction: cap on the reserve, as a share of the device blocks.
    rate_window: seconds of arrival history behind the rate estimate.
    swap_budget: proactive copies per step, in units of the step's forward time.
    swap_in_after_swap_out: allow proactive swap-ins in a step that swaps out (other
    requests); False follows FastServe's code.
    max_evictions: a job whose KV was dropped (recompute) this many times keeps its
    place on the device to its end (`churn.ChurnBound`); None: no cap.
    """

    base_quantum: float | None = None
    quantum_ratio: float = 2.0
    num_queues: int = 16
    starve_limit: float | None = 3.0
    kv_mode: str = "proactive"
    reserve_horizon: float = 0.25
    reserve_max_fraction: float = 0.05
    rate_window: float = 10.0
    swap_budget: float = 1.0
    swap_in_after_swap_out: bool = False
    max_evictions: int | None = 1

    def __post_init__(self) -> None:
        if self.kv_mode not in KV_MODES:
            raise ValueError(f"kv_mode must be one of {KV_MODES}, got {self.kv_mode!r}")
        if self.starve_limit is not None and not self.starve_limit > 0:
            raise ValueError(f"starve_limit must be > 0 or None, got {self.starve_limit!r}")
        if not 0.0 <= self.reserve_max_fraction < 1.0:
            raise ValueError(f"reserve_max_fraction must be in [0, 1), "
                             f"got {self.reserve_max_fraction!r}")
        if not self.quantum_ratio > 1:
            raise ValueError(f"quantum_ratio must be > 1, got {self.quantum_ratio!r}")
        if isinstance(self.num_queues, bool) or not isinstance(self.num_queues, int) \
                or self.num_queues < 1:
            raise ValueError(f"num_queues must be a positive integer, got {self.num_queues!r}")
        if self.max_evictions is not None and (isinstance(self.max_evictions, bool) or not
                                               isinstance(self.max_evictions, int)
                                               or self.max_evictions < 1):
            raise ValueError(f"max_evictions must be a positive integer or None, "
                             f"got {self.max_evictions!r}")
        if self.base_quantum is not None and not self.base_quantum > 0:
            raise ValueError(f"base_quantum must be > 0 or None, got {self.base_quantum!r}")
        for name in ("reserve_horizon", "rate_window", "swap_budget"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0) or (name == "rate_window" and not value):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class JobOrder(Protocol):
    """What the policy needs from a job order (`SkipJoinMLFQ`, `FCFSOrder`)."""

    def __len__(self) -> int: ...

    def add(self, req: Request, first_iteration_time: float, now: float) -> None: ...

    def remove(self, req: Request) -> None: ...

    def mark_run(self, req: Request, now: float) -> None: ...

    def charge(self, req: Request, service: float,
               next_iteration_time: Callable[[Request], float]) -> None: ...

    def charge_batch(self, reqs: Sequence[Request], service: float,
                     next_iteration_time: Callable[[Request], float]) -> None: ...

    def would_promote(self, now: float) -> bool: ...

    def promote_starved(self, now: float) -> list[Request]: ...

    def ordered(self) -> list[Request]: ...

    def enst(self, batch_size: int, now: float,
             wanted: Collection[Request]) -> dict[Request, float]: ...

    def replay_decode_run(self, reqs: Sequence[Request], starts: Sequence[float],
                          services: Sequence[float],
                          next_iteration_time: Callable[[Request, int], float]) -> None: ...


class FastServePolicy(BasePolicy, FastPathDefaults):
    name = "fastserve"
    Options = FastServeOptions

    @classmethod
    def preemption_options(cls, mode: PreemptionMode) -> dict[str, Any]:
        """Swap: the paper's proactive KV swapping (§4.2); recompute: drop paused KV."""
        return {"kv_mode": "proactive" if mode == PreemptionMode.SWAP else "recompute"}

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        opts: FastServeOptions = self.options
        self.order: JobOrder = self._make_order(opts)
        self.kv = KVPlanner(opts.kv_mode, ctx.cost_model, opts.swap_budget,
                            opts.swap_in_after_swap_out)
        self.arrivals = ArrivalRate(opts.rate_window)
        self.churn = ChurnBound(ctx.cost_model, opts.kv_mode != "recompute",
                                DEFAULT_PREFILL_RATE, opts.max_evictions)
        self.stationary = False  # see the design note: decode runs
        self._room = 0  # device blocks the last step left jobs beside the reserve
        self._starved: set[Request] = set()  # promoted for starvation, not run since

    def _make_order(self, opts: FastServeOptions) -> JobOrder:
        base = opts.base_quantum
        if base is None:
            cost = self.ctx.cost_model
            base = cost.decode_time(1, 1) if cost is not None else DEFAULT_BASE_QUANTUM
        quanta = geometric_quanta(base, opts.quantum_ratio, opts.num_queues)
        return SkipJoinMLFQ(quanta, opts.starve_limit)

    @property
    def mlfq(self) -> SkipJoinMLFQ:
        assert isinstance(self.order, SkipJoinMLFQ)
        return self.order

    # ---- predictions ----------------------------------------------------------------
    def iteration_time(self, req: Request) -> float:
        """Predicted time of the job's next iteration run alone (the profiler's P)."""
        n = req.num_uncomputed_tokens
        cost = self.ctx.cost_model
        if cost is None:
            return DEFAULT_BASE_QUANTUM + n / DEFAULT_PREFILL_RATE
        if n <= 1:
            return cost.decode_time(1, req.num_computed_tokens)
        return cost.prefill_time(n, req.num_computed_tokens)

    def reserve_blocks(self, plan: StepPlan) -> int:
        opts: FastServeOptions = self.options
        if opts.kv_mode != "proactive":
            return 0
        expected = self.arrivals.expected_blocks(plan.now, opts.reserve_horizon)
        return min(math.ceil(expected), int(opts.reserve_max_fraction * plan.num_total_blocks))

    # ---- hooks ----------------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        now = self.now
        self.order.add(req, self.iteration_time(req), now)
        self.arrivals.observe(now, num_blocks_for(req.num_prompt_tokens + 1,
                                                  self.ctx.config.block_size))

    def on_finish(self, req: Request) -> None:
        self.order.remove(req)
        self.churn.forget(req)
        self._starved.discard(req)

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None:
        if not batch.requests:
            return
        cost = self.ctx.cost_model
        service = cost.step_time(batch.shape()) if cost is not None else result.duration
        self.order.charge_batch(batch.requests, service, self.iteration_time)

    def schedule(self, plan: StepPlan) -> None:
        now = plan.now
        for req in self.order.promote_starved(now):
            if req.status in _NO_KV:
                self._starved.add(req)
        order = self.order.ordered()
        reserve = self.reserve_blocks(plan)
        protected = self.churn.protected(plan, order, reserve)
        choice = choose(plan, order, reserve, self.kv.runs_swapped,
                        bound_by_host=self.kv.mode != "recompute", protected=protected,
                        starved=self._starved)
        size = max(1, len(plan.claimed))
        self.kv.protected = protected
        self.kv.apply(plan, choice, order, reserve,
                      lambda jobs: self.order.enst(size, now, jobs))
        self.churn.after_step(plan)
        for req in plan.scheduled:
            self.order.mark_run(req, now)
            self._starved.discard(req)
        self._room = plan.num_blocks_above_watermark - reserve
        self.stationary = self._batch_repeats(plan)

    # ---- decode runs ----------------------------------------------------------------
    @property
    def decode_budget(self) -> int:
        """After a finish with nothing waiting or swapped, the batch stays every job when
        the last decision found them all room (`stationary`; the job set only shrank and
        the reserve only shrinks without arrivals): andante.sim.after_finish."""
        return self.ctx.config.max_num_batched_tokens

    def decode_order(self, running: Sequence[Request],
                     num_free_blocks: int) -> list[Request] | None:
        """The batch's order then: the job order (None if a promotion would change it, or
        if the jobs may not all keep their place: after a step with prefills, the room
        it found is checked for their blocks at their last tokens)."""
        if self.order.would_promote(self.now) or len(running) != len(self.order):
            return None
        if not (self.stationary or self._fit_to_the_end(running)):
            return None
        return self.order.ordered()

    def _batch_repeats(self, plan: StepPlan) -> bool:
        """Is this all-decode batch of every job certain to be chosen again, step after
        step, until a job arrives or finishes? (See the design note.)"""
        if plan.waiting or plan.swapped or plan.preemptions or plan.swap_ins \
                or plan.in_flight_ids or len(plan.scheduled) != len(self.order):
            return False
        if sum(plan.num_scheduled_tokens) != len(plan.scheduled):  # each >= 1
            return False
        return self._fit_to_the_end(plan.scheduled)

    def _fit_to_the_end(self, jobs: Sequence[Request]) -> bool:
        """Do the jobs' blocks at their last tokens fit the room the last step found
        beside the reserve (which only shrinks until a job arrives)?"""
        limit, bs = self.ctx.config.max_model_len, self.ctx.config.block_size
        blocks = sum(num_blocks_for(min(r.num_prompt_tokens + r.sampling.max_tokens, limit), bs)
                     for r in jobs)
        return blocks <= self._room

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None:
        """Replay the run's steps on the job order (each step was scheduled when the one
        before it ended: the run's tokens' times)."""
        k = len(durations)
        token_times = batch.requests[0].timeline.token_times
        starts = token_times[-k - 1:-1]
        cost = self.ctx.cost_model

        def next_time(req: Request, step: int) -> float:
            computed = req.num_computed_tokens - (k - 1 - step)
            return cost.decode_time(1, computed) if cost is not None \
                else DEFAULT_BASE_QUANTUM + 1 / DEFAULT_PREFILL_RATE

        self.order.replay_decode_run(batch.requests, starts, durations, next_time)


class FastServeFCFSPolicy(FastServePolicy):
    """The paper's FastServe-FCFS: the same engine and KV management, arrival order."""

    name = "fastserve-fcfs"

    def _make_order(self, opts: FastServeOptions) -> JobOrder:
        return FCFSOrder()
