"""The engine loop over a pipeline whose microbatches complete on their own, so that
consecutive steps overlap (KunServe §4.3, §5; the simulator's clock does the same in
andante.sim.pipeline).

Design note. `Engine.step` drains: it returns once its whole step ran. A pipeline group
instead keeps its stages busy: `OverlappedLoop` forms a step (the engine's scheduler, its
budgets for the free slots: `budgets`) as soon as stage 0 is free and fewer than
`num_stages` microbatches are in flight, hands it to the pipeline (`submit`: the
pipeline cuts it into `free_slots` microbatches, its planner's decision, and feeds them
to stage 0), and applies each pipeline event as it comes: a microbatch that left the last
stage completes its sampling rows (their tokens; those requests may be scheduled again),
one that left stage 0 completes its rows that sample nothing (a prompt's inner chunk:
its next chunk follows it through every stage, andante.exec.microbatch). Requests in
flight are the scheduler's in-flight set, so a request's decode never enters before its
previous token exists; other requests' microbatches do. A step that swaps KV waits for
the pipeline to be empty (a swap copies every stage's blocks at once, which the order of
the stages does not protect).

Mid-flight changes. A request aborted (or stopped) while its microbatch is in flight
is finished and its blocks freed at once; its microbatch still runs (it writes only
blocks of its own, freed now: any later owner's writes come after it at every stage,
which take microbatches in order) and its rows are dropped when they complete (the
scheduler skips a finished request; the request is reported finished once). With
nothing in flight and nothing to schedule, the requests aborted or refused meanwhile
are reported through an empty step, as `Engine.step` does. An
operation that needs no microbatch in flight (a group's restore, grow or shrink, at
a step boundary) first `drain`s the pipeline: every event is applied, no step enters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from andante.core.request import Request
from andante.engine.config import SchedulerConfig
from andante.engine.engine import Engine, StepOutput
from andante.exec.batch import StepBatch, StepResult
from andante.exec.microbatch import PipelineEvent, free_slots


class MicrobatchPipeline(Protocol):
    """What `OverlappedLoop` drives (andante.exec.torch_pipeline's `PipelineExecutor`)."""

    @property
    def num_stages(self) -> int: ...

    def submit(self, batch: StepBatch, num_slots: int) -> int:
        """Cut `batch` into at most `num_slots` microbatches and feed them to stage 0
        (swaps first); returns how many."""

    def next_event(self) -> PipelineEvent:
        """Wait for the next microbatch to leave stage 0 or the last stage."""

    def close(self) -> None:
        """Stop the stages' workers (the pipeline is empty)."""


class OverlappedLoop:
    """Steps `engine` over `pipeline` with steps overlapping (module note). `budgets`:
    the scheduler's config for a step formed with `in_flight` microbatches in the
    pipeline (None: the engine's own config for every step)."""

    def __init__(self, engine: Engine, pipeline: MicrobatchPipeline,
                 budgets: Callable[[int], SchedulerConfig] | None = None) -> None:
        self.engine = engine
        self.pipeline = pipeline
        self.budgets = budgets
        self.in_flight = 0  # microbatches fed, not yet out of the last stage
        self.in_stage0 = 0  # microbatches fed, not yet out of stage 0
        self.num_steps = 0
        self.num_overlapped = 0  # steps that entered with microbatches in flight

    @property
    def has_work(self) -> bool:
        return self.engine.has_work or self.in_flight > 0

    def step(self) -> list[StepOutput]:
        """Form and feed a step if one may enter now, else apply the next event; the
        outputs applied (none when a step entered)."""
        if self.in_stage0 == 0 and self.in_flight < self.pipeline.num_stages:
            entered, outputs = self._enter()
            if entered:
                return outputs
        if self.in_flight == 0:
            return []
        return self._apply(self.pipeline.next_event())

    def run(self) -> None:
        """Step until no work is left (nothing may arrive meanwhile)."""
        try:
            while self.has_work:
                idle, steps = self.in_flight == 0, self.num_steps
                outputs = self.step()
                if idle and self.num_steps == steps and not outputs:
                    break  # nothing schedulable and nothing in flight
        finally:
            self.pipeline.close()

    def _enter(self) -> tuple[bool, list[StepOutput]]:
        batch = self._schedule()
        if batch.is_empty:
            if self.in_flight == 0 and self.engine.has_ended:
                # nothing runs: report the requests aborted or refused meanwhile, as
                # `Engine.step` does with an empty step (else they stay unreported)
                return True, [self.engine.finish_step(batch, StepResult([], 0.0))]
            return False, []
        outputs: list[StepOutput] = []
        if batch.swap_out or batch.swap_in:
            while self.in_flight:  # module note: swaps wait for an empty pipeline
                outputs += self._apply(self.pipeline.next_event())
        slots = free_slots(self.pipeline.num_stages, self.in_flight)
        if self.in_flight:
            self.num_overlapped += 1
        fed = self.pipeline.submit(batch, slots)
        self.num_steps += 1
        if fed == 0:  # swaps only
            outputs.append(self.engine.finish_step(batch, StepResult([], 0.0)))
        self.in_flight += fed
        self.in_stage0 += fed
        return True, outputs

    def _schedule(self) -> StepBatch:
        scheduler = self.engine.scheduler
        if self.budgets is None:
            return self.engine.schedule_step()
        own = scheduler.config
        scheduler.config = self.budgets(self.in_flight)
        try:
            return self.engine.schedule_step()
        finally:
            scheduler.config = own

    def drain(self) -> list[StepOutput]:
        """Apply every event until no microbatch is in flight (none enters meanwhile);
        the outputs applied."""
        outputs: list[StepOutput] = []
        while self.in_flight:
            outputs += self._apply(self.pipeline.next_event())
        return outputs

    def _apply(self, event: PipelineEvent) -> list[StepOutput]:
        if event.last_stage:
            self.in_flight -= 1
        else:
            self.in_stage0 -= 1
        if event.batch.is_empty:  # it completed no rows
            return []
        # rows of requests finished while in flight (module note) were reported then,
        # or are among the engine's ended ones, which the output carries once
        reported = {id(r) for r in event.batch.requests if r.is_finished}
        ended = self.engine.take_ended() if reported else []
        output = self.engine.finish_step(event.batch, event.result)
        if reported:
            output.finished = [r for r in output.finished if id(r) not in reported] + ended
        return [output]


def merge_outputs(outputs: list[StepOutput]) -> StepOutput:
    """Several applied outputs as one (what a served instance reports after a loop
    step): each request once among the updated and the finished; the last batch."""
    if len(outputs) == 1:
        return outputs[0]
    last = outputs[-1]
    return StepOutput(last.batch, last.result,
                      _unique(r for o in outputs for r in o.updated),
                      _unique(r for o in outputs for r in o.finished),
                      sum(o.num_steps for o in outputs))


def _unique(requests: Iterable[Request]) -> list[Request]:
    seen: set[int] = set()
    unique: list[Request] = []
    for req in requests:
        if id(req) not in seen:
            seen.add(id(req))
            unique.append(req)
    return unique
