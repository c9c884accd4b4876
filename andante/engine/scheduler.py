"""The scheduler: owns the queues and the block manager, applies a policy's plan.

One class serves the real engine and the simulator (DESIGN.md rule 1): time comes
from the injected clock, decisions from the policy, costs from the executor.
A scheduled request stays "in flight" until `update` applies its batch; with pipeline
parallelism (several batches in flight) the next `schedule` neither schedules nor
preempts it (the plan's `running` leaves it out). One batch at a time: nothing changes.

Prefix caching (the block manager's, `andante.kv.prefix_cache`): before each schedule
the requests holding no KV whose content the block manager tracks start at their
tentative prefix hit (`num_computed_tokens` = cached tokens), so that every policy's
arithmetic sees only the tokens left to compute; admission shares the hit blocks and
counts the lookup (vLLM's prefix_cache_queries / hits, in tokens) on the request's
timeline and in the scheduler's totals; after each step the blocks it filled are
registered (`KVBlockManager.cache_computed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from andante.core.clock import Clock
from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.config import SchedulerConfig
from andante.engine.plan import StepPlan
from andante.engine.policy import Policy
from andante.engine.stopping import check_stop
from andante.exec.batch import StepBatch, StepResult
from andante.kv.block_manager import KVBlockManager

_NO_KV = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
_RUNNING = RequestStatus.RUNNING
_FINISHED = RequestStatus.FINISHED_STOPPED  # this and above are terminal
_REQUEST_ID = attrgetter("request_id")


class RequestRejected(ValueError):
    """The request can never be served here (too long for the context or the KV cache)."""


def _check_budget(config: SchedulerConfig, policy: Policy) -> None:
    """A policy that prefills whole prompts needs a step budget of max_model_len (as vLLM
    v0 without chunked prefill), or a long prompt, or a long request's recompute, would
    wait forever."""
    budget, max_len = config.max_num_batched_tokens, config.max_model_len
    if budget < max_len and not getattr(policy, "chunks_prefill", False):
        raise ValueError(
            f"policy {policy.name!r} prefills whole prompts: max_num_batched_tokens "
            f"({budget}) must be >= max_model_len ({max_len})"
        )


@dataclass(slots=True)
class WorkTotals:
    """Sums over the scheduler's unfinished requests, kept where requests are added,
    advance, are preempted by recompute and leave, so that stats (and the load reports
    built on them) never walk the queues."""

    num_without_output: int = 0  # requests still waiting for their first token
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_computed_tokens: int = 0  # tokens in a KV cache (device or host)
    num_max_output_tokens: int = 0  # the sum of the requests' max_tokens

    def add(self, req: Request, sign: int = 1) -> None:
        """Count `req` in (sign 1) or out (sign -1) with its figures now."""
        num_output = req.num_output_tokens
        self.num_without_output += sign * (num_output == 0)
        self.num_prompt_tokens += sign * req.num_prompt_tokens
        self.num_output_tokens += sign * num_output
        self.num_computed_tokens += sign * req.num_computed_tokens
        self.num_max_output_tokens += sign * req.sampling.max_tokens


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVBlockManager,
        policy: Policy,
        clock: Clock,
    ) -> None:
        self.config = config
        self.kv = kv
        self.policy = policy
        self.clock = clock
        # each victim's preemption mode by cost (QLM's Insight #2); None: config's mode
        self.preemption_mode_of: Callable[[Request], PreemptionMode] | None = None
        # a request stops at this length (prompt + output): the model's context, or the
        # whole device KV cache (its next token could never fit)
        self.max_num_tokens = min(config.max_model_len, kv.num_device_blocks * kv.block_size)
        _check_budget(config, policy)
        self._init_queues()

    def _init_queues(self) -> None:
        self.waiting: list[Request] = []  # WAITING or PREEMPTED, no KV
        self.running: list[Request] = []  # RUNNING, device KV, admission order
        self.swapped: list[Request] = []  # SWAPPED, host KV
        self.requests: dict[str, Request] = {}  # every unfinished request
        self._released_ids: list[str] = []
        self._in_flight_ids: set[str] = set()  # scheduled, batch not applied yet
        self.num_preemptions = 0
        self._last_step_preempted = False
        self._num_added = 0  # requests ever added
        self._num_added_at_schedule = 0
        self.totals = WorkTotals()
        self._prefix_waiting: dict[str, Request] = {}  # tracked by the cache, no KV
        self.num_prefix_query_tokens = 0  # tokens looked up at admissions
        self.num_prefix_hit_tokens = 0  # of them, found in the prefix cache
        self._evictions: dict[str, PreemptionMode] = {}  # asked for (QLM's agent, LSO 2)

    # ---- figures --------------------------------------------------------------------
    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_swapped(self) -> int:
        return len(self.swapped)

    @property
    def last_step_preempted(self) -> bool:
        return self._last_step_preempted

    @property
    def added_since_schedule(self) -> bool:
        """Did a request arrive after the last `schedule()`?"""
        return self._num_added != self._num_added_at_schedule

    # ---- admission and aborts -------------------------------------------------------
    def check_fits(self, num_prompt_tokens: int) -> None:
        """Raise RequestRejected if a prompt of this length could never be served."""
        if num_prompt_tokens >= self.config.max_model_len:
            limit = self.config.max_model_len
            context = (f"the model's context is {limit} tokens"
                       if self.config.max_model_len_set_by is None else
                       f"the context is {limit} tokens ({self.config.max_model_len_set_by})")
            raise RequestRejected(f"prompt has {num_prompt_tokens} tokens; {context} "
                                  "(prompt + at least 1 output token)")
        need = self.kv.num_blocks_for(num_prompt_tokens + 1)
        if need > self.kv.num_device_blocks:
            capacity = self.kv.num_device_blocks * self.kv.block_size
            raise RequestRejected(
                f"prompt has {num_prompt_tokens} tokens; the whole KV cache holds {capacity}"
            )

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise RequestRejected(f"duplicate request id {req.request_id!r}")
        if req.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            raise RequestRejected(f"request {req.request_id!r} is {req.status.name}")
        self.check_fits(req.num_prompt_tokens)
        req.num_computed_tokens = 0  # holds no KV here (a tentative hit of elsewhere)
        self.requests[req.request_id] = req
        if self.kv.track(req):
            self._prefix_waiting[req.request_id] = req
        self.totals.add(req)
        self.waiting.append(req)
        self._num_added += 1
        self.policy.on_arrival(req)

    def withdraw(self, request_id: str) -> Request | None:
        """Take back a request that never ran (WAITING, no KV, no output) so another
        instance can serve it (cluster migration and offload); None if it is unknown or
        has started. The policy forgets it through `on_finish` (it left this scheduler);
        the request itself is untouched and can be added elsewhere."""
        req = self.requests.get(request_id)
        if req is None or req.status != RequestStatus.WAITING or req.output_token_ids:
            return None
        if request_id in self._in_flight_ids or self.kv.holds_kv(request_id):
            return None
        del self.requests[request_id]
        self.totals.add(req, -1)
        req.num_computed_tokens = 0  # a tentative prefix hit of this instance's cache
        self._forget_prefix(request_id)
        self.waiting = [r for r in self.waiting if r is not req]
        self.policy.on_finish(req)
        return req

    # ---- moving requests between schedulers (KunServe pipeline groups) -------------
    @property
    def has_in_flight(self) -> bool:
        return bool(self._in_flight_ids)

    @property
    def has_evictions(self) -> bool:
        """Preemptions asked for (`request_preemption`) that the next step applies."""
        return bool(self._evictions)

    def hold(self, request_id: str) -> None:
        """Keep a request out of the coming steps, as if its batch were in flight, until
        `release` (KunServe: its KV is still being exchanged); it is neither scheduled
        nor preempted meanwhile."""
        if request_id in self.requests:
            self._in_flight_ids.add(request_id)

    def release(self, request_id: str) -> None:
        self._in_flight_ids.discard(request_id)

    def detach(self, request_id: str) -> Request | None:
        """Take an unfinished request out of this scheduler as it is (status, progress
        and timeline kept; its KV here freed) so another scheduler can `adopt` it; None
        if it is unknown or its batch is in flight."""
        req = self.requests.get(request_id)
        if req is None or request_id in self._in_flight_ids:
            return None
        del self.requests[request_id]
        self.totals.add(req, -1)
        self.kv.free(request_id)
        self.waiting = [r for r in self.waiting if r is not req]
        self.running = [r for r in self.running if r is not req]
        self.swapped = [r for r in self.swapped if r is not req]
        self.policy.on_finish(req)
        return req

    def adopt(self, req: Request) -> list[int] | None:
        """Take in a detached request. WAITING/PREEMPTED ones queue (PREEMPTED at the
        front, as after a preemption); a RUNNING one keeps its progress and gets a new
        device table covering its computed tokens, returned (None, nothing changed, if
        it does not fit: the caller recomputes it instead)."""
        rid = req.request_id
        if rid in self.requests:
            raise RequestRejected(f"duplicate request id {rid!r}")
        table: list[int] = []
        if req.status == _RUNNING:
            if not self.kv.can_allocate(rid, req.num_computed_tokens):
                return None
            table = list(self.kv.allocate(rid, req.num_computed_tokens))
            self.running.append(req)
        elif req.status == RequestStatus.PREEMPTED:
            self.waiting.insert(0, req)
        elif req.status == RequestStatus.WAITING:
            self.waiting.append(req)
        else:
            raise RequestRejected(f"request {rid!r} is {req.status.name}: cannot adopt it")
        self.requests[rid] = req
        self.totals.add(req)
        self._num_added += 1
        self.policy.on_arrival(req)
        return table

    def abort_request(
        self, request_id: str, status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> Request | None:
        """Finish the request (as aborted, or as `status`: the front end stops it at a
        stop string) and free its KV now; None if unknown."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        self._finish(req, status, self.clock.now())
        self._drop_finished()
        return req

    # ---- one step -------------------------------------------------------------------
    def schedule(self) -> StepBatch:
        now = self.clock.now()
        self._num_added_at_schedule = self._num_added
        running, in_flight = self.running, frozenset(self._in_flight_ids)
        if in_flight:  # pipeline parallelism: other batches are still being computed
            running = [r for r in self.running if r.request_id not in in_flight]
        if self._prefix_waiting:
            self._refresh_prefix_hits()
        plan = StepPlan(
            self.kv, self.config, now, self.waiting, running, self.swapped, in_flight,
            self.preemption_mode_of, self.max_num_tokens,
        )
        if self._evictions:
            self._evict(plan)
        self.policy.schedule(plan)
        return self._apply(plan, now)

    def request_preemption(self, request_id: str, mode: PreemptionMode) -> None:
        """Preempt this running request (by `mode`; recompute when the host tier is
        full) at the start of the next step, before the policy decides: an eviction or
        state swap asked for from outside (QLM's agent, LSOs 2-3). Ignored if it is not
        running then."""
        self._evictions[request_id] = mode

    def _evict(self, plan: StepPlan) -> None:
        for rid, mode in self._evictions.items():
            req = self.requests.get(rid)
            if req is None or not plan.can_preempt(req, PreemptionMode.RECOMPUTE):
                continue
            if mode == PreemptionMode.SWAP and not plan.can_preempt(req, mode):
                mode = PreemptionMode.RECOMPUTE
            plan.preempt(req, mode)
        self._evictions = {}

    def _refresh_prefix_hits(self) -> None:
        """Start each tracked request holding no KV at its prefix hit now (tentative:
        blocks evicted before its admission make it wait for the next lookup). Only the
        requests whose hit may have changed are looked up (`take_due_lookups`)."""
        lookup, totals, waiting = self.kv.lookup_prefix, self.totals, self._prefix_waiting
        for request_id in self.kv.take_due_lookups():
            req = waiting.get(request_id)
            if req is None:
                continue  # admitted or swapped since: it holds KV
            hit = lookup(req)
            if hit != req.num_computed_tokens:
                totals.num_computed_tokens += hit - req.num_computed_tokens
                req.num_computed_tokens = hit

    def _count_prefix_hit(self, req: Request) -> None:
        """An admission of a tracked request: its lookup counts (vLLM's queries/hits)."""
        del self._prefix_waiting[req.request_id]
        timeline = req.timeline
        timeline.num_prefix_query_tokens += req.num_tokens
        timeline.num_prefix_hit_tokens += req.num_computed_tokens
        self.num_prefix_query_tokens += req.num_tokens
        self.num_prefix_hit_tokens += req.num_computed_tokens

    def _forget_prefix(self, request_id: str) -> None:
        self._prefix_waiting.pop(request_id, None)
        self.kv.forget(request_id)

    def _apply(self, plan: StepPlan, now: float) -> StepBatch:
        """Move the plan's requests between queues; its blocks are already allocated."""
        self.kv.end_step()
        batch = StepBatch(released_ids=self._released_ids, swap_out=plan.swap_out_blocks,
                          swap_in=plan.swap_in_blocks)
        self._released_ids = []
        self._last_step_preempted = bool(plan.preemptions)
        if plan.preemptions:
            self._apply_preemptions(plan, batch, now)
        for req in plan.swap_ins:
            req.swap_in()
            self.running.append(req)
        if plan.swap_ins:
            self.swapped = [r for r in self.swapped if r.status == RequestStatus.SWAPPED]
        self._apply_schedule(plan, batch, now)
        return batch

    def _apply_preemptions(self, plan: StepPlan, batch: StepBatch, now: float) -> None:
        recomputed: list[Request] = []
        for req, mode in plan.preemptions:
            if mode == PreemptionMode.SWAP:
                req.swap_out(now)
                self.swapped.append(req)
            else:
                self.totals.num_computed_tokens -= req.num_computed_tokens
                req.preempt_by_recompute(now)
                batch.released_ids.append(req.request_id)
                recomputed.append(req)
                if self.kv.is_tracked(req.request_id):
                    self._prefix_waiting[req.request_id] = req
        self.num_preemptions += len(plan.preemptions)
        self.waiting[:0] = recomputed  # vLLM puts them at the front of the queue
        self.running = [r for r in self.running if r.status == _RUNNING]

    def _apply_schedule(self, plan: StepPlan, batch: StepBatch, now: float) -> None:
        scheduled, num_new = plan.scheduled, plan.num_scheduled_tokens
        admitted = False
        for req in scheduled:
            if req.status in _NO_KV:
                req.start_running(now)
                self.running.append(req)
                admitted = True
                if req.request_id in self._prefix_waiting:
                    self._count_prefix_hit(req)
        ids = list(map(_REQUEST_ID, scheduled))
        self._in_flight_ids.update(ids)
        cached = [req.num_computed_tokens for req in scheduled]
        samples = [c + n == req.num_tokens
                   for c, n, req in zip(cached, num_new, scheduled, strict=True)]
        batch.add_all(scheduled, num_new, cached, samples,
                      list(map(self.kv.block_table, ids)))
        if admitted:
            self.waiting = [r for r in self.waiting if r.status in _NO_KV]

    def update(self, batch: StepBatch, result: StepResult) -> list[Request]:
        """Record the step's tokens; returns the requests that got a token or finished."""
        self._in_flight_ids.difference_update(map(_REQUEST_ID, batch.requests))
        touched = self.record_tokens(
            batch.requests, batch.num_new_tokens, result.sampled_token_ids, self.clock.now()
        )
        self.policy.on_step_end(batch, result)
        return touched

    def record_tokens(
        self, requests: Sequence[Request], num_computed: Iterable[int],
        token_ids: Iterable[int | None], now: float, *later: float,
    ) -> list[Request]:
        """Advance each request by its `num_computed` tokens now in its KV cache, give it
        its token (None: none) at `now` (and at each of `later`: the simulator's decode
        run of identical steps), and finish it if the token stops it (`check_stop`).
        Returns the requests that got a token."""
        got: list[Request] = []
        finished = False
        limit = self.max_num_tokens
        num_computed_total = num_first = 0
        times = (now, *later)
        for req, n, token in zip(requests, num_computed, token_ids, strict=False):
            req.num_computed_tokens += n
            if req.status >= _FINISHED:  # aborted while its batch was in flight
                continue
            num_computed_total += n
            if token is None:
                continue
            if not req.timeline.token_times:  # its first token (cheaper than the output)
                num_first += 1
            if later:  # a simulator run's steps
                req.append_output_run(token, times)
            else:
                req.append_output_token(token, now)
            got.append(req)
            status = check_stop(req, token, limit)
            if status is not None:
                self._finish(req, status, later[-1] if later else now)
                finished = True
        totals = self.totals
        totals.num_computed_tokens += num_computed_total
        totals.num_output_tokens += len(got) * (1 + len(later))
        totals.num_without_output -= num_first
        self.kv.cache_computed(requests)
        if finished:  # only running requests get tokens
            self.running = [r for r in self.running if r.status < _FINISHED]
        return got

    # ---- finishing ------------------------------------------------------------------
    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        req.finish(status, now)
        self._in_flight_ids.discard(req.request_id)
        self.kv.cache_computed((req,))  # its last full blocks, before they are freed
        if self.kv.free(req.request_id):
            self._released_ids.append(req.request_id)
        self._forget_prefix(req.request_id)
        del self.requests[req.request_id]
        self.totals.add(req, -1)
        self.policy.on_finish(req)

    def _drop_finished(self) -> None:
        self.waiting = [r for r in self.waiting if r.status < _FINISHED]
        self.running = [r for r in self.running if r.status < _FINISHED]
        self.swapped = [r for r in self.swapped if r.status < _FINISHED]
