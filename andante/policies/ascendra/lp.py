"""`ascendra-lp`: Ascendra's low-priority (throughput) instance.

Design note (Ascendra §5, Algorithm 1 and §5.3-5.4). Each step first advances every
decoding request by one token (piggybacked decodes keep generation from stalling), then
continues chunked prefills already under way, then re-admits preempted requests, then
packs new prefills out of order: the waiting requests are sorted by a value function
(EDF by default, `values`) and taken in that order while they fit three budgets — C,
predicted step time from the performance model (only while the step also decodes: it is
what the decodes' TBT pays), M, free KV blocks, and N, tokens — stopping at the first
that does not fit (whose prefix may run as a chunk). Requests that have not started and
would miss their TTFT SLO even if started now on an HP instance busy with a full batch
(wait + predicted prefill + full-batch time > SLO) are handed back to the controller,
prompt only, to be offloaded to an HP instance; each request is offloaded at most once.
The batch size stays small (the engine's max_num_seqs, 128 in the paper) to keep room
for decodes. With nothing waiting and every running request decoding, the next steps
repeat this one until an arrival or a finish: the policy is then `stationary` (the
simulator's decode runs feed the performance model through `on_decode_run`); a prompt's
chunks beside decodes with nothing waiting become simulator prefill runs too
(`prefill_runs`). C's largest chunk is the bisection's answer; where the model's step
time only grows with the chunk, `largest_within` finds it in fewer model calls (secant
steps from the prompt's previous chunk), the same n.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from andante.core.request import Request, RequestStatus
from andante.engine.plan import StepPlan
from andante.engine.policy import PolicyContext
from andante.perf.shape import BatchShape
from andante.policies.ascendra.common import AscendraBase, decode_shape, shape_with
from andante.policies.ascendra.options import LPOptions
from andante.policies.ascendra.prefill_runs import PrefillRuns, time_grows_with_tokens
from andante.policies.ascendra.values import value_function
from andante.policies.phases import advance_with_preemption

_SECANT_STEPS = 6  # then `largest_within` halves its bracket


def _decode_tokens(req: Request) -> int:
    return 1 if req.num_uncomputed_tokens == 1 else 0


def largest_by_bisection(time_of: Callable[[int], float], limit: int, budget: float) -> int:
    """The largest n < limit with time_of(n) <= budget, by Algorithm 1's bisection
    (0 if none; time_of need not grow with n)."""
    lo, hi = 0, limit - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if time_of(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_within(time_of: Callable[[int], float], limit: int, budget: float,
                   t_limit: float, hint: int = 1) -> int:
    """The largest n in [1, limit) with time_of(n) <= budget (0 if none), for a
    non-decreasing `time_of` (t_limit = time_of(limit) > budget): the bisection's answer,
    found by secant steps through the last two points probed, kept inside the bracket
    (halving after `_SECANT_STEPS` of them), from a first probe at `hint` (a previous
    answer, or 1)."""
    lo, hi = 0, limit  # fits at lo (0: nothing needs to), not at hi
    first = min(max(hint, 1), limit - 1)
    (a, t_a), (b, t_b) = (limit, t_limit), (first, time_of(first) if first else t_limit)
    if first:
        lo, hi = (first, hi) if t_b <= budget else (lo, first)
    steps = 0
    while hi - lo > 1:
        guess = (lo + hi + 1) // 2
        if steps < _SECANT_STEPS and t_b != t_a:
            x = b + (budget - t_b) * (b - a) / (t_b - t_a)
            if math.isfinite(x):
                guess = min(max(math.floor(x), lo + 1), hi - 1)
        steps += 1
        t = time_of(guess)
        if t <= budget:
            lo = guess
        else:
            hi = guess
        (a, t_a), (b, t_b) = (b, t_b), (guess, t)
    return lo


def _all_past_prompt(decodes: list[Request]) -> bool:
    """Does every decode count as one (`BatchShape.num_decode_seqs`)?"""
    return all(r.num_computed_tokens for r in decodes)


class AscendraLPPolicy(PrefillRuns, AscendraBase):
    name = "ascendra-lp"
    Options = LPOptions

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.options: LPOptions
        self._value = value_function(self.options.value)
        self._prefill: dict[str, tuple[int, float]] = {}  # id -> (model version, seconds)
        self._full_batch = (-1, 0.0)
        self._grows = (-1, False)  # (model version, time_grows_with_tokens)
        self._last_chunk: dict[str, int] = {}  # id -> its prompt's latest chunk (a hint)
        self._recent_chunk = 1  # the latest chunk of any prompt (a hint)
        self._handoffs: list[str] = []
        self._handed: set[str] = set()  # offloaded once: never again
        self.stationary = False  # see the design note

    # ---- hooks --------------------------------------------------------------------
    def take_handoffs(self) -> list[str]:
        out, self._handoffs = self._handoffs, []
        return out

    def on_finish(self, req: Request) -> None:
        self._prefill.pop(req.request_id, None)
        self._last_chunk.pop(req.request_id, None)

    # ---- predictions --------------------------------------------------------------
    def prefill_time(self, req: Request) -> float:
        version = self.perf_model.version
        cached = self._prefill.get(req.request_id)
        if cached is None or cached[0] != version:
            cached = (version, self.perf_model.prefill_time(req.num_prompt_tokens))
            self._prefill[req.request_id] = cached
        return cached[1]

    def full_batch_time(self) -> float:
        """A worst-case HP step: `hp_batch_tokens` prompt tokens."""
        version = self.perf_model.version
        if self._full_batch[0] != version:
            time = self.perf_model.prefill_time(self.options.hp_batch_tokens)
            self._full_batch = (version, time)
        return self._full_batch[1]

    def at_risk(self, req: Request, now: float) -> bool:
        """§5.3: would it miss its TTFT SLO even if an HP instance started it now?"""
        wait = now - req.arrival_time
        return wait + self.prefill_time(req) + self.full_batch_time() > self.ttft_of(req)

    @property
    def decode_budget(self) -> int:
        """With nothing waiting, the running decodes advance in order within the step's
        token budget (andante.sim.after_finish)."""
        return min(self.ctx.config.max_num_batched_tokens, self.options.token_budget)

    # ---- one step -----------------------------------------------------------------
    def schedule(self, plan: StepPlan) -> None:
        opts = self.options
        plan.restrict_token_budget(opts.token_budget)
        running, waiting = plan.running, plan.waiting
        advance_with_preemption(plan, running, _decode_tokens)
        decodes = plan.scheduled  # (one token each)
        all_decode = len(decodes) == len(running) and not plan.preemptions
        if all_decode and not waiting:  # nothing to pack: the common decode step
            self.stationary = not plan.swapped and _all_past_prompt(decodes)
            return
        shape = decode_shape(decodes)
        budget = self._step_budget(decodes) if decodes else math.inf
        if not all_decode:
            for req in running:
                if req.num_uncomputed_tokens > 1 and not plan.is_preempted(req):
                    self._pack(plan, req, shape, budget, chunk=True)
        fresh = [r for r in waiting if not r.output_token_ids]
        resumed = [r for r in waiting if r.output_token_ids]
        for req in [*resumed, *self._by_value(fresh, plan.now)]:
            if not self._pack(plan, req, shape, budget, chunk=opts.chunk):
                break
        if opts.offload:
            self._pick_offloads(plan, fresh)
        self.stationary = not (waiting or plan.swapped or plan.preemptions) and len(
            plan.scheduled) == len(running) and shape.num_decode_seqs == shape.num_seqs

    def _step_budget(self, decodes: list[Request]) -> float:
        """C: what the decodes' TBT allows (an explicit `step_budget` wins)."""
        opts = self.options
        if opts.step_budget is not None:
            return opts.step_budget
        default = opts.tbt_slo
        tightest = min((r.slo.tbt if r.slo.tbt is not None else default) for r in decodes)
        return opts.tbt_share * tightest

    def _by_value(self, reqs: list[Request], now: float) -> list[Request]:
        value = self._value
        keyed = [(-value(r, now, self.prefill_time(r), self.ttft_of(r)), i, r)
                 for i, r in enumerate(reqs)]
        keyed.sort(key=lambda item: (item[0], item[1]))
        return [item[2] for item in keyed]

    def _pack(self, plan: StepPlan, req: Request, shape: BatchShape, budget: float,
              chunk: bool) -> bool:
        """Algorithm 1's test: schedule all of `req` if it fits C, M and N (True), else
        possibly a chunk of it (False: stop packing)."""
        if req.status != RequestStatus.RUNNING and (
            not plan.has_seq_room or not plan.can_reserve_prefill(req)
        ):
            return False
        whole = req.num_uncomputed_tokens
        n = self._fit_time(shape, req.num_computed_tokens, whole,
                           plan.max_schedulable_tokens(req), budget,
                           self._last_chunk.get(req.request_id, self._recent_chunk))
        if n == whole:
            self._add(plan, req, n, shape)
            return True
        if chunk and n >= min(self.options.min_chunk, whole):
            self._add(plan, req, n, shape)
        return False

    def _fit_time(self, shape: BatchShape, cached: int, whole: int, limit: int,
                  budget: float, hint: int = 1) -> int:
        """The largest n <= limit whose step stays within `budget` (predicted) when a
        request with `cached` tokens computed and `whole` left joins `shape` by n (as
        Algorithm 1's bisection finds it: 0 if none)."""
        if limit <= 0 or budget == math.inf:
            return max(0, limit)
        predict, scratch = self.perf_model.cost_model.step_time, BatchShape()  # (predict)

        def time_of(n: int) -> float:
            return predict(shape_with(shape, n, cached, n == whole, scratch))

        t_limit = time_of(limit)
        if t_limit <= budget:
            return limit
        if self._time_grows():
            return largest_within(time_of, limit, budget, t_limit, hint)
        return largest_by_bisection(time_of, limit, budget)

    def _time_grows(self) -> bool:
        """Does the model's step time never fall as a chunk grows (per model version)?"""
        version = self.perf_model.version
        if self._grows[0] != version:
            self._grows = (version, time_grows_with_tokens(self.perf_model.cost_model))
        return self._grows[1]

    def _add(self, plan: StepPlan, req: Request, n: int, shape: BatchShape) -> None:
        whole = n == req.num_uncomputed_tokens
        shape.add(n, req.num_computed_tokens, whole)
        plan.schedule(req, n)
        self.note_chunk(req.request_id, n, whole)

    def note_chunk(self, request_id: str, n: int, last: bool) -> None:
        """Remember a prompt's chunk: where the search for its next one starts."""
        if last:
            self._last_chunk.pop(request_id, None)
        else:
            self._last_chunk[request_id] = self._recent_chunk = n

    def _pick_offloads(self, plan: StepPlan, fresh: list[Request]) -> None:
        now = plan.now
        for req in fresh:
            rid = req.request_id
            # never run (a prefix hit's computed tokens are no start: issue 30 item 5)
            if plan.is_scheduled(req) or rid in self._handed or \
                    req.status != RequestStatus.WAITING:
                continue
            if self.at_risk(req, now):
                self._handed.add(rid)
                self._handoffs.append(rid)
