"""The scheduler: owns the queues and the block manager, applies a policy's plan.

One class serves the real engine and the simulator (DESIGN.md rule 1): time comes
from the injected clock, decisions from the policy, costs from the executor.
A scheduled request stays "in flight" until `update` applies its batch; with pipeline
parallelism (several batches in flight) the next `schedule` neither schedules nor
preempts it (the plan's `running` leaves it out). One batch at a time: nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
            raise RequestRejected(
                f"prompt has {num_prompt_tokens} tokens; the model's context is "
                f"{self.config.max_model_len} tokens (prompt + at least 1 output token)"
            )
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
        self.requests[req.request_id] = req
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
        if req.num_computed_tokens or request_id in self._in_flight_ids:
            return None
        del self.requests[request_id]
        self.waiting = [r for r in self.waiting if r is not req]
        self.policy.on_finish(req)
        return req

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
        plan = StepPlan(
            self.kv, self.config, now, self.waiting, running, self.swapped, in_flight
        )
        self.policy.schedule(plan)
        return self._apply(plan, now)

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
                req.preempt_by_recompute(now)
                batch.released_ids.append(req.request_id)
                recomputed.append(req)
        self.num_preemptions += len(plan.preemptions)
        self.waiting[:0] = recomputed  # vLLM puts them at the front of the queue
        self.running = [r for r in self.running if r.status == _RUNNING]

    def _apply_schedule(self, plan: StepPlan, batch: StepBatch, now: float) -> None:
        block_table = self.kv.block_table
        admitted = False
        mark_in_flight = self._in_flight_ids.add
        for req, n in zip(plan.scheduled, plan.num_scheduled_tokens, strict=True):
            rid = req.request_id
            cached = req.num_computed_tokens
            if req.status in _NO_KV:
                req.start_running(now)
                self.running.append(req)
                admitted = True
            mark_in_flight(rid)
            batch.add(req, n, cached, cached + n == req.num_tokens, block_table(rid))
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
        for req, n, token in zip(requests, num_computed, token_ids, strict=False):
            req.num_computed_tokens += n
            if token is None or req.status >= _FINISHED:
                continue
            if later:
                req.append_output_token(token, now, *later)
            else:  # a step (a call without unpacking is faster)
                req.append_output_token(token, now)
            got.append(req)
            status = check_stop(req, token, limit)
            if status is not None:
                self._finish(req, status, later[-1] if later else now)
                finished = True
        if finished:
            self._drop_finished()
        return got

    # ---- finishing ------------------------------------------------------------------
    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        req.finish(status, now)
        self._in_flight_ids.discard(req.request_id)
        if self.kv.free(req.request_id):
            self._released_ids.append(req.request_id)
        del self.requests[req.request_id]
        self.policy.on_finish(req)

    def _drop_finished(self) -> None:
        self.waiting = [r for r in self.waiting if not r.is_finished]
        self.running = [r for r in self.running if not r.is_finished]
        self.swapped = [r for r in self.swapped if not r.is_finished]
