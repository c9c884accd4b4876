"""andante's policies as a vLLM v1 scheduler class (`--scheduler-cls andante.vllm.Scheduler`).

Design note (DESIGN.md §1 vllm/, §4 "one instance, two clocks"). vLLM's `Scheduler`
stays in charge of everything but the decision: requests, their queues and statuses,
the KV cache manager (the one owner of blocks), outputs, stop checks, stats and
/metrics. Each step this subclass asks andante's policy instead of running vLLM's
own loop: it builds the same `StepPlan` andante's engine builds, over andante's view of
vLLM's requests (andante.vllm.mirror) and of vLLM's KV cache manager
(andante.vllm.kv_view), lets the policy decide (which waiting requests to admit, which
running ones to preempt, in what order, how many tokens each advances), then turns
the plan into vLLM's `SchedulerOutput` exactly as vLLM's `schedule` assembles its own.
The policy code is the code andante's engine and simulator run; no policy is copied.

What differs from andante's engine, and why: vLLM v1 has no KV swap, so every
preemption is a recompute (vLLM's `_preempt_request`, which requeues the request at
the front of vLLM's waiting queue; the adapter keeps its view of the queue in vLLM's
order); prefix-cache hits are vLLM's, looked up for the waiting requests at the start
of each step; requests blocked in vLLM (a grammar compiling, a streaming session) are
left out of the plan until vLLM unblocks them. After each step the policy hears of
the tokens (`on_step_end`, with the step's measured duration: from the end of
`schedule` to the start of `update_from_output`, the executor's time) and of finished
or aborted requests (`on_finish`). The step log records the whole cycle instead (from
the call of `schedule` to the end of `update_from_output`: scheduling and output
processing included), since that is what a served request's TPOT pays.

Observable (andante.vllm.observe): a startup line, the policy's state every
`log_interval` seconds (QoE estimates, preemptions by cause, the queue's head), the
step log (`step_log`, what `andante calibrate --step-log` fits: a record per step, and
per request its arrival, when `add_request` took it in and its first token, the
engine's side of the front end's time); preemptions are
vLLM's own, so vLLM's vllm:num_preemptions counts them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

import vllm
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus as VllmStatus

from andante.core.clock import WallClock
from andante.core.request import Request, RequestStatus
from andante.engine.plan import StepPlan
from andante.exec.batch import StepBatch, StepResult
from andante.kv.block_manager import KVBlockManager
from andante.vllm.config import (
    ConfigError,
    check_version,
    check_vllm_config,
    parse_config,
)
from andante.vllm.kv_view import PrefixHit, VllmKVView
from andante.vllm.mirror import SLOError, finished_status, mirror, slo_from_extra_args
from andante.vllm.observe import Observer
from andante.vllm.setup import build_policy, cost_model, scheduler_config

logger = logging.getLogger("vllm.andante")  # under vLLM's configured logger

_QUEUED = (VllmStatus.WAITING, VllmStatus.PREEMPTED)
_NO_KV = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


@dataclass(slots=True)
class _Step:
    """A scheduled step until its output comes back."""

    output: SchedulerOutput
    batch: StepBatch
    vllm_requests: list[VllmRequest]
    started: float = 0.0  # perf_counter when `schedule` returned it
    cycle_started: float = 0.0  # perf_counter when `schedule` was called


@dataclass(slots=True)
class _Decisions:
    """vLLM's side of one plan: what `SchedulerOutput` is assembled from."""

    new: list[VllmRequest] = field(default_factory=list)
    resumed: list[VllmRequest] = field(default_factory=list)
    running: list[VllmRequest] = field(default_factory=list)
    num_tokens: dict[str, int] = field(default_factory=dict)
    new_blocks: dict[str, KVCacheBlocks] = field(default_factory=dict)


class Scheduler(VllmScheduler):
    """vLLM's scheduler with andante's policy deciding each step (module note)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            self._init_andante()
        except ConfigError as exc:
            logger.error("andante.vllm: %s", exc)
            raise

    def _init_andante(self) -> None:
        check_version(vllm.__version__)
        self.andante_config = parse_config(self.vllm_config.additional_config)
        check_vllm_config(self.vllm_config, self.kv_cache_config)
        self.andante_clock = WallClock()  # vLLM's arrival stamps are time.time()
        self.andante_sched_config = scheduler_config(
            self.vllm_config, self.block_size, self.max_num_scheduled_tokens)
        from vllm.platforms import current_platform

        costs = cost_model(self.vllm_config, self.andante_config.hardware,
                           current_platform.is_cpu())
        self.andante_policy = build_policy(self.andante_config, self.andante_sched_config,
                                           self.andante_clock, costs)
        self._init_mirrors()
        self.observer = Observer(self.andante_config, self.andante_policy.name,
                                 self.andante_clock)
        self.observer.log_startup(vllm.__version__, costs, self.andante_sched_config)

    def _init_mirrors(self) -> None:
        self.mirrors: dict[str, Request] = {}
        self.mirror_waiting: list[Request] = []  # vLLM's waiting queue, in its order
        self.mirror_running: list[Request] = []
        self._blocked_ids: set[str] = set()  # queued in vLLM, not schedulable yet
        self._steps: deque[_Step] = deque()
        self._cycle_started = 0.0  # perf_counter when the current `schedule` was called
        # request id -> (vLLM's arrival stamp, when add_request took it in, wall seconds;
        # whether the engine was idle then), until its first token (the step log's
        # request records: andante.perf.frontend_log)
        self._seen: dict[str, tuple[float, float, bool]] = {}
        self.kv_view = VllmKVView(self.kv_cache_manager, self.requests, self,
                                  self.scheduler_reserve_full_isl)

    # ---- requests in and out ------------------------------------------------------
    def add_request(self, request: VllmRequest) -> None:
        is_new = request.request_id not in self.requests
        seen = time.time()  # vLLM's arrival_time is time.time() too (its API server's)
        idle = not self.requests  # the engine core was waiting for work, not stepping
        super().add_request(request)
        if not is_new:
            return  # a streaming session's next input: the same request
        if self.observer.logs_steps:
            self._seen[request.request_id] = (request.arrival_time, seen, idle)
        params = request.sampling_params
        try:
            slo = slo_from_extra_args(params.extra_args if params is not None else None)
        except SLOError as exc:
            logger.warning("andante.vllm: request %s refused: %s", request.request_id, exc)
            # finished as an error by update_from_output (vLLM's path for bad requests)
            self.grammar_compile_error_reqs.add(request.request_id)
            return
        req = mirror(request, self.andante_clock.origin, slo)
        self.mirrors[request.request_id] = req
        self.mirror_waiting.append(req)
        if request.status not in _QUEUED:
            self._blocked_ids.add(request.request_id)
        self.andante_policy.on_arrival(req)

    def finish_requests(self, request_ids: Any, finished_status: VllmStatus,
                        ) -> list[VllmRequest]:
        finished = super().finish_requests(request_ids, finished_status)
        self._forget([(r.request_id, r.status) for r in finished])
        return finished

    def _forget(self, finished: list[tuple[str, VllmStatus]]) -> None:
        """Finish the mirrors of requests vLLM finished; the policy forgets them."""
        now = self.andante_clock.now()
        gone: list[Request] = []
        for rid, vllm_status in finished:
            self._seen.pop(rid, None)
            req = self.mirrors.pop(rid, None)
            if req is None:
                continue
            self._blocked_ids.discard(rid)
            if not req.is_finished:
                req.finish(finished_status(vllm_status), now)
            gone.append(req)
        if not gone:
            return
        self.mirror_waiting = [r for r in self.mirror_waiting if not r.is_finished]
        self.mirror_running = [r for r in self.mirror_running if not r.is_finished]
        for req in gone:
            self.andante_policy.on_finish(req)

    # ---- one step -------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self.current_step += 1
        self._step_timestamp = time.monotonic()
        self._cycle_started = time.perf_counter()
        self.kv_cache_manager.new_step_starts()
        now = self.andante_clock.now()
        waiting, running = self._plannable()
        self._sync_computed(waiting, running)
        # the view answers every block-manager call StepPlan makes (structurally)
        kv = cast(KVBlockManager, self.kv_view)
        plan = StepPlan(kv, self.andante_sched_config, now, waiting, running, [])
        free_before = self.kv_view.num_free_device_blocks
        self.andante_policy.schedule(plan)
        decisions = self._apply(plan, now, free_before)
        return self._output(decisions, plan)

    def _plannable(self) -> tuple[list[Request], list[Request]]:
        """The queues the policy plans over: every mirror, less the blocked waiting
        requests (and nothing while vLLM is paused)."""
        if self._pause_state == PauseState.PAUSED_ALL:
            return [], []
        waiting = self.mirror_waiting
        if self._blocked_ids:
            for rid in list(self._blocked_ids):
                vreq = self.requests.get(rid)
                if vreq is None or self._handle_blocked_waiting_request(vreq):
                    self._blocked_ids.discard(rid)
            blocked = self._blocked_ids
            waiting = [r for r in waiting if r.request_id not in blocked]
        if self._pause_state != PauseState.UNPAUSED:
            waiting = []
        return waiting, self.mirror_running

    def _sync_computed(self, waiting: list[Request], running: list[Request]) -> None:
        """Running mirrors take vLLM's computed tokens; waiting ones start at their
        prefix-cache hit (vLLM's lookup), as andante's scheduler starts them."""
        requests = self.requests
        for req in running:
            req.num_computed_tokens = requests[req.request_id].num_computed_tokens
        hits: dict[str, PrefixHit] = {}
        if self.cache_config.enable_prefix_caching:
            lookup = self.kv_cache_manager.get_computed_blocks
            for req in waiting:
                vreq = requests[req.request_id]
                blocks, num_hit, boundary = lookup(vreq)
                req.num_computed_tokens = num_hit
                if num_hit:
                    hits[req.request_id] = PrefixHit(blocks, num_hit, boundary)
        self.kv_view.start_step(hits)

    def preempt(self, request_id: str) -> None:
        """The plan preempts a running request: vLLM's own preemption (recompute)."""
        vreq = self.requests[request_id]
        self.running.remove(vreq)
        self._preempt_request(vreq, self._step_timestamp)

    def _apply(self, plan: StepPlan, now: float, free_before: int) -> _Decisions:
        """Carry the plan out on vLLM's requests and queues, and on the mirrors."""
        decisions = _Decisions()
        preempted = [req for req, _ in plan.preemptions]
        for req in preempted:
            req.preempt_by_recompute(now)
        admitted = self._apply_schedule(plan, now, decisions)
        if preempted or admitted:
            self.mirror_running = [r for r in self.mirror_running
                                   if r.status == RequestStatus.RUNNING] + admitted
            # vLLM prepends each preempted request in turn: the last one leads
            rest = [r for r in self.mirror_waiting if r.status in _NO_KV] if admitted \
                else self.mirror_waiting
            self.mirror_waiting = preempted[::-1] + rest
            requests = self.requests
            self.running = [requests[r.request_id] for r in self.mirror_running]
        if preempted:
            grew = sum(len(decisions.new_blocks[v.request_id].blocks[0])
                       for v in decisions.running if v.request_id in decisions.new_blocks)
            self.observer.count_preemptions(len(preempted), grew > free_before)
        return decisions

    def _apply_schedule(self, plan: StepPlan, now: float, decisions: _Decisions,
                        ) -> list[Request]:
        """vLLM's state for each scheduled request; returns the mirrors admitted."""
        admitted: list[Request] = []
        admitted_vllm: list[VllmRequest] = []
        requests, new_blocks = self.requests, self.kv_view.new_blocks
        allocate = self.kv_cache_manager.allocate_slots
        for req, num in zip(plan.scheduled, plan.num_scheduled_tokens, strict=True):
            rid = req.request_id
            vreq = requests[rid]
            blocks = new_blocks.get(rid)
            if req.status in _NO_KV:
                self._admit(vreq, req.num_computed_tokens, num, decisions)
                req.start_running(now)
                admitted.append(req)
                admitted_vllm.append(vreq)
            else:
                decisions.running.append(vreq)
                if blocks is None:  # a decode within its blocks: vLLM still caches
                    blocks = allocate(vreq, num)
                    if blocks is None:
                        raise RuntimeError(f"andante.vllm: {rid} lost its blocks")
            decisions.num_tokens[rid] = num
            decisions.new_blocks[rid] = blocks if blocks is not None else \
                self.kv_cache_manager.empty_kv_cache_blocks
        if admitted_vllm:
            self.waiting.remove_requests(admitted_vllm)
        return admitted

    def _admit(self, vreq: VllmRequest, num_hit: int, num: int,
               decisions: _Decisions) -> None:
        """What vLLM's waiting loop does for a request it admits (blocks allocated)."""
        hit = self.kv_view.hits.get(vreq.request_id)
        if self.cache_config.enable_prefix_caching:
            self.kv_cache_manager.record_prefix_cache_stats(vreq, num_hit)
            vreq.shared_prefix_boundary = hit.shared_prefix_boundary if hit else 0
        if vreq.prefill_stats and vreq.num_preemptions <= 0:
            vreq.prefill_stats.set(num_prompt_tokens=vreq.num_prompt_tokens,
                                   num_local_cached_tokens=num_hit,
                                   num_external_cached_tokens=0)
        if self.log_stats:
            vreq.record_event(EngineCoreEventType.SCHEDULED, self._step_timestamp)
        (decisions.new if vreq.status == VllmStatus.WAITING else decisions.resumed).append(vreq)
        vreq.status = VllmStatus.RUNNING
        vreq.num_computed_tokens = num_hit
        self.deferred_waiting.discard(vreq)
        if num_hit + num < vreq.num_tokens:
            self._inflight_prefills.add(vreq)

    def _output(self, d: _Decisions, plan: StepPlan) -> SchedulerOutput:
        """vLLM's SchedulerOutput of the decisions, assembled as vLLM's `schedule` does
        (text-only, one KV group, no connectors, no spec decode: checked at startup)."""
        new_reqs, resumed = d.new, d.resumed
        if self.use_v2_model_runner:
            new_reqs, resumed = new_reqs + resumed, []
            new_data = [NewRequestData.from_request(
                r, d.new_blocks[r.request_id].get_block_ids(), r._all_token_ids,
                uses_mrope=self.model_uses_mrope) for r in new_reqs]
        else:
            new_data = [NewRequestData.from_request(
                r, d.new_blocks[r.request_id].get_block_ids(),
                uses_mrope=self.model_uses_mrope) for r in new_reqs]
        cached = self._make_cached_request_data(d.running, resumed, d.num_tokens, {},
                                                d.new_blocks)
        if not self.use_v2_model_runner:
            self.prev_step_scheduled_req_ids.clear()
            self.prev_step_scheduled_req_ids.update(d.num_tokens)
        self.kv_cache_manager.take_boundary_state_offloads()
        copies, retained = self.kv_cache_manager.take_kv_cache_block_copies()
        if copies:
            self._free_cow_retained_blocks(retained, self.sched_step_seq + 1)
        output = SchedulerOutput(
            scheduled_new_reqs=new_data, scheduled_cached_reqs=cached,
            num_scheduled_tokens=d.num_tokens,
            total_num_scheduled_tokens=sum(d.num_tokens.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=self.encoder_cache_manager.get_freed_mm_hashes(),
            new_block_ids_to_zero=self._get_new_block_ids_to_zero(),
            kv_cache_block_copies=copies or None,
            num_spec_tokens_to_schedule=self.num_spec_tokens,
            ec_manager_metadata=self.encoder_cache_manager.get_manager_metadata(),
        )
        self._update_after_schedule(output)
        self._track(output, plan)
        return output

    def _track(self, output: SchedulerOutput, plan: StepPlan) -> None:
        """Remember the step's batch (andante's view) until its output returns."""
        if not plan.scheduled:
            return
        batch = StepBatch()
        cached = [r.num_computed_tokens for r in plan.scheduled]
        samples = [c + n == r.num_tokens for c, n, r in
                   zip(cached, plan.num_scheduled_tokens, plan.scheduled, strict=True)]
        batch.add_all(list(plan.scheduled), list(plan.num_scheduled_tokens), cached,
                      samples, [[] for _ in plan.scheduled])
        vreqs = [self.requests[r.request_id] for r in plan.scheduled]
        self._steps.append(_Step(output, batch, vreqs, time.perf_counter(),
                                 self._cycle_started))

    # ---- the step's output ----------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: Any) -> dict[int, Any]:
        ended = time.perf_counter()
        step = self._steps.popleft() if self._steps and \
            self._steps[0].output is scheduler_output else None
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if step is not None:
            self._record(step, ended - step.started, time.perf_counter() - step.cycle_started)
        self.observer.maybe_log_state(self)
        return outputs

    def _first_token(self, request_id: str) -> None:
        """Log the request's engine side (arrival, taken in, first token: wall seconds)."""
        stamps = self._seen.pop(request_id, None)
        if stamps is not None:
            self.observer.log_request(request_id, *stamps, time.time())

    def _record(self, step: _Step, duration: float, cycle: float) -> None:
        """Give the mirrors their tokens; the policy hears of the step (`duration`, the
        executor's time); log it (`cycle`: from the call of `schedule` to the end of
        `update_from_output`, the engine core's whole step, which a served request's
        TPOT pays and a simulated step must cost)."""
        now = self.andante_clock.now()
        sampled: list[int | None] = []
        finished: list[tuple[str, VllmStatus]] = []
        running = RequestStatus.RUNNING
        for req, vreq in zip(step.batch.requests, step.vllm_requests, strict=True):
            token = None
            if not req.is_finished:
                out = vreq.output_token_ids
                num_new = len(out) - req.num_output_tokens
                if num_new and req.num_output_tokens == 0:
                    self._first_token(req.request_id)
                if num_new == 1:  # the common case: one token this step
                    token = out[-1]
                    req.append_output_token(token, now)
                elif num_new > 1:
                    for token in out[req.num_output_tokens:]:
                        req.append_output_token(token, now)
                if vreq.status > VllmStatus.PREEMPTED:  # finished (vLLM's order)
                    finished.append((req.request_id, vreq.status))
                elif req.status == running:
                    req.num_computed_tokens = vreq.num_computed_tokens
            sampled.append(token)
        if finished:
            self._forget(finished)
        result = StepResult(sampled_token_ids=sampled, duration=duration)
        self.andante_policy.on_step_end(step.batch, result)
        self.observer.log_step(step.batch, cycle, len(self.mirror_waiting))
