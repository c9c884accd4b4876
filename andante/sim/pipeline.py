"""Pipeline-parallel instances for the simulator.

Design note: FastServe §4.3 (pipeline parallelism in distributed serving). An instance
of `pp` stages gives each stage ⌈L/pp⌉ of the model's L layers (on `tp` GPUs) and the
matching share of every token's KV cache. A batch crosses the stages one after another;
a new batch may enter stage 0 as soon as the previous one has left it, so up to `pp`
batches are in flight. At each stage boundary the scheduler picks a new batch from the
*pending* requests: the requests of batches still in the pipeline are neither scheduled
nor preempted until their batch completes (the Scheduler's in-flight set), while they
keep their place in the policy's queues. Any policy works unchanged.

Stages are balanced: each one runs a batch for the step time d of one stage (a cost
model of the stage's layers; the LM head is counted on every stage, i.e. d is the time
of the last, slowest stage), plus the point-to-point hop of the hidden states between
stages. Each stage swaps its own KV shard over its own host link, in parallel, so a
swap costs what it costs one stage. The policy's cost model is the stage's: its step
times measure the pipeline's throughput (one batch per d), not a batch's latency (pp·d).

A step may be cut into microbatches (`microbatches`; KunServe's groups do,
andante.sim.kunserve_instance). Each microbatch crosses the stages after the previous one;
where a microbatch says which step rows it completes (the rows whose last tokens it
carries), those requests get their tokens, and may be scheduled again, when *it* leaves
the last stage, not when the step's last microbatch does (KunServe §4.3: microbatches in
flight, no drain between steps). A new step enters stage 0 once stage 0 is free and fewer
than `pp` microbatches are in flight.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field

from andante.core.clock import ManualClock
from andante.engine.engine import Engine, StepOutput
from andante.exec.batch import StepBatch, StepResult
from andante.exec.microbatch import rows_step
from andante.exec.sim_executor import GIB, SimExecutor
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.specs import ModelSpec
from andante.sim.simulator import SimInstance
from andante.sim.spec import ClusterSpec


def stage_model(model: ModelSpec, pp: int) -> ModelSpec:
    """The shape of one of `pp` pipeline stages: ⌈num_layers / pp⌉ layers."""
    if pp < 1 or pp > model.num_layers:
        raise ValueError(f"pp must be in [1, {model.num_layers}] for {model.name}, got {pp}")
    if pp == 1:
        return model
    layers = -(-model.num_layers // pp)
    return dataclasses.replace(model, name=f"{model.name}/pp{pp}", num_layers=layers)


@dataclass(frozen=True, slots=True)
class Microbatch:
    """Part of a step as it crosses the stages: `seconds` on each stage, `num_tokens`
    (the hidden states it sends on), `completes`, the step rows whose last tokens it
    carries and that wait for its last stage (their sampled token; None: the whole step
    completes with its last microbatch), and `ordered`, the rows whose last piece it
    holds but that sample nothing (a prompt's inner chunk): their next chunk needs no
    token, only to follow this one through every stage, so they are applied when it
    leaves stage 0."""

    seconds: float
    num_tokens: int
    completes: tuple[int, ...] | None = None
    ordered: tuple[int, ...] = ()


@dataclass(order=True, slots=True)
class Completion:
    """Step rows the engine applies at `when` (ties: in the order they were made), and
    how many microbatches leave the pipeline then."""

    when: float
    seq: int
    batch: StepBatch = field(compare=False)
    result: StepResult = field(compare=False)
    retires: int = field(compare=False)


class PipelineSimInstance(SimInstance):
    """A `SimInstance` that keeps up to `num_stages` batches in flight. It has no decode
    runs: consecutive steps overlap, so runs of identical steps do not apply."""

    def __init__(self, index: int, engine: Engine, num_stages: int, hop_per_token: float,
                 hop_latency: float) -> None:
        super().__init__(index, engine)
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        self.num_stages = num_stages
        self._hop_per_token = hop_per_token
        self._hop_latency = hop_latency
        self._stage_free = [0.0] * num_stages  # when each stage finishes its last batch
        self._pipeline: list[Completion] = []  # a heap: what the engine applies next
        self._seq = 0
        self._num_micro = 0  # microbatches in flight

    @property
    def num_in_flight(self) -> int:
        """Microbatches in the pipeline (entered stage 0, not yet out of the last)."""
        return self._num_micro

    def completions(self) -> list[Completion]:
        """What the engine will apply, earliest first."""
        return sorted(self._pipeline)

    @property
    def busy(self) -> bool:
        if self._num_micro >= self.num_stages:
            return True
        return self.engine.clock.now() < self._stage_free[0]

    def begin_step(self, now: float) -> float | None:
        batch, result = self.engine.begin_step()
        if batch.is_empty:
            return None
        # no microbatch in any stage: the instance was idle, and wakes before stage 0
        start = now + (0.0 if self._pipeline else self.wake_time(now))
        micro = self.microbatches(batch, result)
        crossings = [self._through_stages(start, m.seconds, m.num_tokens) for m in micro]
        self.stats.busy_time += sum(m.seconds for m in micro)
        parts = self._completions(batch, result, micro, crossings) if micro \
            else [(now, batch, result, 0)]
        last = max(when for when, *_ in parts)
        waited = max(i for i, (when, *_) in enumerate(parts) if when == last)
        for i, (when, sub, sub_result, retires) in enumerate(parts):
            heapq.heappush(self._pipeline, Completion(when, self._seq, sub, sub_result,
                                                      retires))
            self._seq += 1
            if i != waited:  # the caller waits for `last`, one event per other part
                self.hooks.step_done_at(self, when)
        self._num_micro += len(micro)
        return last

    def _completions(self, batch: StepBatch, result: StepResult, micro: list[Microbatch],
                     crossings: list[tuple[float, float]]
                     ) -> list[tuple[float, StepBatch, StepResult, int]]:
        """(when, rows' batch, their result, microbatches retired): per microbatch, its
        rows waiting for the last stage (it retires then) and its `ordered` rows at its
        stage-0 exit; one for the whole step where microbatches do not say."""
        if any(m.completes is None for m in micro):
            return [(crossings[-1][1], batch, result, len(micro))]
        out: list[tuple[float, StepBatch, StepResult, int]] = []
        for m, (first_out, last_out) in zip(micro, crossings, strict=True):
            assert m.completes is not None
            tokens, swap = result.sampled_token_ids, result.swap_time
            if m.ordered:
                out.append((first_out, *rows_step(batch, tokens, m.ordered, 0.0, not out, swap),
                            0))
            out.append((last_out, *rows_step(batch, tokens, m.completes, m.seconds, not out,
                                             swap), 1))
        return out

    def microbatches(self, batch: StepBatch, result: StepResult) -> list[Microbatch]:
        """The step's microbatches in the order they enter stage 0 (here the whole step
        is one, completing with it)."""
        return [Microbatch(result.duration, batch.num_tokens)]

    def stage_times(self, batch: StepBatch, result: StepResult) -> list[tuple[float, int]]:
        """Each microbatch's time on a stage and its token count."""
        return [(m.seconds, m.num_tokens) for m in self.microbatches(batch, result)]

    def _through_stages(self, now: float, per_stage: float, num_tokens: int
                        ) -> tuple[float, float]:
        """Send a microbatch through the stages (each takes it when free, after the
        previous one); returns when it leaves stage 0 and the last stage."""
        hop = self._hop_latency + self._hop_per_token * num_tokens
        t = now
        for stage in range(self.num_stages):
            if stage:
                t = self._hop_done(t, hop)
            t = max(t, self._stage_free[stage]) + per_stage
            self._stage_free[stage] = t
        return self._stage_free[0], t

    def _hop_done(self, start: float, hop: float) -> float:
        """When hidden states sent at `start` reach the next stage (KunServe's groups
        share the link with KV exchanges)."""
        return start + hop

    def finish_step(self) -> tuple[StepBatch, StepOutput]:
        done = heapq.heappop(self._pipeline)  # the earliest: its event fires now
        batch, result = done.batch, done.result
        self._num_micro -= done.retires
        self.last_step_end = self.engine.clock.now()
        if self._stage_free[0] > self.engine.clock.now():  # stage 0 still busy: the
            self.hooks.wake_at(self, self._stage_free[0])  # freed slot starts then
        output = self.engine.finish_step(batch, result)
        self.stats.num_steps += 1
        return batch, output

    def next_start_time(self) -> float | None:
        return self._stage_free[0] if self._num_micro < self.num_stages else None


def build_pipeline_instance(spec: ClusterSpec, index: int, clock: ManualClock) -> SimInstance:
    """An instance of `spec.pp` stages of `spec.tp` GPUs each."""
    hardware = get_hardware(spec.hardware)
    model = get_model(spec.model)
    stage_cost = CostModel(stage_model(model, spec.pp), hardware, tp=spec.tp)
    executor = SimExecutor(
        stage_cost,
        block_size=spec.scheduler.block_size,
        host_kv_bytes=int(spec.swap_space_gib * GIB * spec.tp),  # per stage
        gpu_memory_utilization=spec.gpu_memory_utilization,
        overlap_swaps=spec.overlap_swaps,
        step_buckets=None,  # the real pipeline stages run unpadded steps
        num_device_blocks=spec.num_kv_blocks,
    )
    engine = build_engine(executor, clock, spec.policy, spec.scheduler, spec.policy_options)
    # Hidden states cross to the next stage: every tp rank sends its replica's share.
    hop_per_token = model.hidden_size * model.dtype_bytes / (
        hardware.interconnect_bandwidth * spec.tp)
    return PipelineSimInstance(index, engine, spec.pp, hop_per_token,
                               hardware.collective_latency)
