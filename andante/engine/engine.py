"""The engine step loop: schedule, execute, update (DESIGN.md §3).

`step()` runs one whole step (real serving). The simulator splits it: `begin_step()`
at the step's start time, `finish_step()` once its modeled duration has elapsed on the
simulated clock. Every method runs on the thread that steps the engine: the one
thread-safe inbox of a served instance is its worker's (andante.runtime.worker).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.core.clock import Clock
from andante.core.request import Request, RequestStatus
from andante.engine.scheduler import RequestRejected, Scheduler
from andante.engine.stall import is_stalled, refuse_one
from andante.engine.stats import EngineLimits, SchedulerStats, StepObserver
from andante.exec.base import Executor
from andante.exec.batch import StepBatch, StepResult


@dataclass(slots=True)
class StepOutput:
    """What one step produced: requests with a new token, and requests that finished
    (including ones aborted or rejected at this step boundary). A simulator's decode run
    is one output standing for `num_steps` identical steps (`updated` got a token at
    each, `result.duration` is their sum)."""

    batch: StepBatch
    result: StepResult
    updated: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    num_steps: int = 1


class Engine:
    def __init__(self, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self._ended: list[Request] = []  # aborted/rejected since the last step output
        self._observers: list[StepObserver] = []
        self.num_steps = 0
        self.num_stalls = 0  # requests refused because the engine stalled (engine.stall)

    # ---- observing ------------------------------------------------------------------
    @property
    def has_observers(self) -> bool:
        return bool(self._observers)

    def add_observer(self, observer: StepObserver) -> None:
        """Call `observer(output, stats)` after every step from now on."""
        self._observers.append(observer)

    def stats(self) -> SchedulerStats:
        """The engine's figures now (O(1))."""
        sched, kv = self.scheduler, self.scheduler.kv
        totals = sched.totals
        num_tokens = totals.num_prompt_tokens + totals.num_output_tokens
        return SchedulerStats(
            time=self.clock.now(),
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            num_swapped=sched.num_swapped,
            num_free_blocks=kv.num_free_device_blocks,
            num_blocks=kv.num_device_blocks,
            num_free_host_blocks=kv.num_free_host_blocks,
            num_host_blocks=kv.host.num_blocks,
            num_preemptions=sched.num_preemptions,
            num_steps=self.num_steps,
            max_num_seqs=sched.config.max_num_seqs,
            num_prefilling=totals.num_without_output,
            num_tokens=num_tokens,
            num_uncomputed_tokens=num_tokens - totals.num_computed_tokens,
            num_output_tokens=totals.num_output_tokens,
            num_remaining_output_tokens=totals.num_max_output_tokens - totals.num_output_tokens,
            prefix_cache_queries=sched.num_prefix_query_tokens,
            prefix_cache_hits=sched.num_prefix_hit_tokens,
            num_cached_free_blocks=kv.num_cached_free_blocks,
            num_queued_kv_blocks=kv.num_blocks_for(
                max(0, num_tokens - totals.num_computed_tokens - sched.num_running)),
        )

    def limits(self) -> EngineLimits:
        kv = self.scheduler.kv
        return EngineLimits(self.scheduler.config.max_model_len,
                            kv.num_device_blocks * kv.block_size)

    def notify(self, output: StepOutput) -> None:
        """Count the output's steps and tell the observers (`finish_step` calls it; so
        does the simulator for a decode run it recorded at once)."""
        self.num_steps += output.num_steps
        if self._observers:
            stats = self.stats()
            for observer in self._observers:
                observer(output, stats)

    def finish_stopped(self, output: StepOutput, request_ids: list[str]) -> None:
        """Finish (reason "stop") the requests whose text the front end found a stop string
        in after this step (as vLLM's output processor); they join `output.finished`."""
        for request_id in request_ids:
            req = self.scheduler.abort_request(request_id, RequestStatus.FINISHED_STOPPED)
            if req is not None:
                output.finished.append(req)

    # ---- input --------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Add now; raises RequestRejected if it can never be served."""
        self.scheduler.add_request(req)

    def submit(self, req: Request) -> bool:
        """Add now (the one way in for served and simulated instances); False if it can
        never be served: it is then finished as rejected and reported with the next
        step's output, or by `take_ended`."""
        try:
            self.scheduler.add_request(req)
        except RequestRejected as exc:
            if not req.is_finished:
                req.reject(str(exc), self.clock.now())
            self._ended.append(req)
            return False
        return True

    def abort(self, request_id: str) -> None:
        """Abort now (its KV is freed); reported with the next step's output."""
        req = self.scheduler.abort_request(request_id)
        if req is not None:
            self._ended.append(req)

    def take_ended(self) -> list[Request]:
        """The requests aborted or refused since the last step output, taken now: the
        caller reports them (the simulator, at once) and the next output will not."""
        ended, self._ended = self._ended, []
        return ended

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished or bool(self._ended)

    @property
    def has_ended(self) -> bool:
        """Requests aborted or refused that no output reported yet."""
        return bool(self._ended)

    # ---- stepping -------------------------------------------------------------------
    def begin_step(self) -> tuple[StepBatch, StepResult]:
        """Schedule and execute; the result's duration is modeled or measured."""
        batch = self.schedule_step()
        if batch.is_empty:
            return batch, StepResult(sampled_token_ids=[], duration=0.0)
        return batch, self.executor.execute(batch)

    def schedule_step(self) -> StepBatch:
        """The next step's batch, not executed (a stall resolved as `begin_step` does):
        for a caller that runs it itself (andante.engine.overlap)."""
        batch = self.scheduler.schedule()
        if batch.is_empty and is_stalled(self.scheduler):
            batch = self._resolve_stall()
        return batch

    def _resolve_stall(self) -> StepBatch:
        """Work, none in flight, an empty step: schedule once more, then refuse one
        request at a time until a step is not empty (andante.engine.stall)."""
        scheduler = self.scheduler
        batch = scheduler.schedule()
        while batch.is_empty and is_stalled(scheduler):
            victim = refuse_one(scheduler)
            if victim is None:
                break
            self.num_stalls += 1
            self._ended.append(victim)
            batch = scheduler.schedule()
        return batch

    def finish_step(self, batch: StepBatch, result: StepResult) -> StepOutput:
        """Apply the step's result at the current clock time."""
        updated = self.scheduler.update(batch, result) if not batch.is_empty else []
        finished = [r for r in batch.requests if r.is_finished]
        if self._ended:
            finished.extend(self.take_ended())
        output = StepOutput(batch, result, updated, finished)
        self.notify(output)
        return output

    def step(self) -> StepOutput:
        batch, result = self.begin_step()
        return self.finish_step(batch, result)
