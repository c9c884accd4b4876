"""The engine loop of a KunServe pipeline group's leader on in-process engines: its
steps overlap in the group's pipeline (KunServe §4.3, §5).

Design note. Once a group forms with `pipelined` stages, the leader's worker steps its
engine through `GroupLoop` (the worker's `EngineLoop`, andante.runtime.worker) instead
of `Engine.step`: andante.engine.overlap's `OverlappedLoop` over the group's
`PipelineExecutor`, a step entering stage 0 as soon as it is free while earlier
microbatches are still in later stages, each microbatch's rows applied as it completes,
with one instance's budgets per free slot (lookahead's `slot_config`, the simulator's
rule) and, with `lookahead`, the simulator's balance across returning microbatches
(`SlotBudgets`: lookahead's `balanced_slot_config`, the same call the simulator makes,
fed with this pipeline's state: its requests in flight, the scheduler's queue, and the
stage times of its last `num_stages` microbatches by the engine's cost model scaled to
the widest stage, `stage_cost_model`). Aborts and finishes apply mid-flight (the
overlap module's note). Every group operation of the leader (restore, grow, shrink,
a member's failure) runs at a step boundary with no microbatch in flight: `drain`
applies what is in flight first, and the outputs it applied go out with the worker's
next message. After a restore the loop steps the engine as `Engine.step` does (the
worker keeps it; the next formation runs it over the new group's pipeline).
"""

from __future__ import annotations

from andante.cluster.kunserve.lookahead import (
    balanced_slot_config,
    queued_work,
    slot_config,
    stage_cost_model,
)
from andante.engine.config import SchedulerConfig
from andante.engine.engine import Engine, StepOutput
from andante.engine.overlap import OverlappedLoop, merge_outputs
from andante.exec.torch_pipeline import PipelineExecutor


class SlotBudgets:
    """The scheduler's budgets for a step formed with `in_flight` microbatches in
    `pipeline` (module note): `base`'s per free slot, balanced by lookahead."""

    def __init__(self, engine: Engine, pipeline: PipelineExecutor, base: SchedulerConfig,
                 lookahead: bool = True) -> None:
        self.engine = engine
        self.pipeline = pipeline
        self.base = base
        self.lookahead = lookahead
        self._stage_cost = stage_cost_model(pipeline.cost_model, self._slices())
        self._costed_for = self._slices()

    def _slices(self) -> list[tuple[int, int]]:
        return [s.layers_range for s in self.pipeline.stages]

    def __call__(self, in_flight: int) -> SchedulerConfig:
        pipeline = self.pipeline
        config = slot_config(self.base, pipeline.num_stages, in_flight)
        if not self.lookahead or not in_flight:
            return config
        if self._slices() != self._costed_for:  # the group grew or shrank
            self._stage_cost = stage_cost_model(pipeline.cost_model, self._slices())
            self._costed_for = self._slices()
        scheduler = self.engine.scheduler
        decodes, queued = queued_work(scheduler.running, scheduler.waiting,
                                      pipeline.in_flight_ids())
        recent = [self._stage_cost.step_time(shape) for shape in pipeline.recent_shapes]
        return balanced_slot_config(config, self._stage_cost, decodes, queued, recent)


class GroupLoop:
    """A leader's engine loop (see the module note)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.overlapped: OverlappedLoop | None = None
        self._pending: list[StepOutput] = []  # applied by `drain`, not reported yet
        self._overlapped_before = 0  # steps that overlapped in groups restored since

    @property
    def has_work(self) -> bool:
        if self._pending:
            return True
        return self.engine.has_work if self.overlapped is None else self.overlapped.has_work

    def step_output(self) -> tuple[StepOutput | None, bool]:
        """One loop step: the outputs it (and a drain before it) applied, merged, and
        whether a batch ran (entered, is in flight or completed)."""
        outputs, self._pending = self._pending, []
        overlapped = self.overlapped
        if overlapped is None:
            if self.engine.has_work:
                outputs.append(self.engine.step())
            ran = any(o.batch.num_seqs > 0 for o in outputs)
        else:
            entered = overlapped.num_steps
            if overlapped.has_work:
                outputs += overlapped.step()
            ran = overlapped.in_flight > 0 or overlapped.num_steps > entered or any(
                o.batch.num_seqs > 0 for o in outputs)
        return (merge_outputs(outputs) if outputs else None), ran

    def drain(self) -> None:
        """Apply every microbatch in flight (a group operation follows)."""
        if self.overlapped is not None:
            self._pending += self.overlapped.drain()

    def run_on(self, pipeline: PipelineExecutor, lookahead: bool = True) -> None:
        """Overlap the engine's steps in `pipeline` (the engine runs it now), with the
        engine's current budgets per free slot, balanced by `lookahead` (`SlotBudgets`)."""
        self.drain()
        self.overlapped = OverlappedLoop(self.engine, pipeline, SlotBudgets(
            self.engine, pipeline, self.engine.scheduler.config, lookahead))

    def stop(self) -> None:
        """Step the engine as `Engine.step` does again (the group is restored); its
        stage threads stop."""
        if self.overlapped is None:
            return
        self.drain()
        self.overlapped.pipeline.close()
        self._overlapped_before += self.overlapped.num_overlapped
        self.overlapped = None

    @property
    def num_overlapped(self) -> int:
        """Steps that entered with microbatches of earlier steps in flight (every group
        this loop ran)."""
        now = 0 if self.overlapped is None else self.overlapped.num_overlapped
        return self._overlapped_before + now
