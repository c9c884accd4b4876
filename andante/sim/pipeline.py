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
"""

from __future__ import annotations

import dataclasses
from collections import deque

from andante.core.clock import ManualClock
from andante.engine.engine import Engine, StepOutput
from andante.exec.batch import StepBatch, StepResult
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
        self._pipeline: deque[tuple[StepBatch, StepResult]] = deque()

    @property
    def num_in_flight(self) -> int:
        return len(self._pipeline)

    @property
    def busy(self) -> bool:
        if len(self._pipeline) >= self.num_stages:
            return True
        return self.engine.clock.now() < self._stage_free[0]

    def begin_step(self, now: float) -> float | None:
        batch, result = self.engine.begin_step()
        if batch.is_empty:
            return None
        # no batch in any stage: the instance was idle, and wakes before stage 0 starts
        start = now + (0.0 if self._pipeline else self.wake_time(now))
        micro = self.stage_times(batch, result)
        done = now
        for per_stage, num_tokens in micro:
            done = self._through_stages(start, per_stage, num_tokens)
        self._pipeline.append((batch, result))
        self.stats.busy_time += sum(t for t, _ in micro)
        return done

    def stage_times(self, batch: StepBatch, result: StepResult) -> list[tuple[float, int]]:
        """The step's microbatches in the order they enter stage 0: each one's time on
        a stage and its token count (here the whole step is one microbatch)."""
        return [(result.duration, batch.num_tokens)]

    def _through_stages(self, now: float, per_stage: float, num_tokens: int) -> float:
        """Send a microbatch through the stages (each takes it when free, after the
        previous one); returns when it leaves the last stage."""
        hop = self._hop_latency + self._hop_per_token * num_tokens
        t = now
        for stage in range(self.num_stages):
            if stage:
                t = self._hop_done(t, hop)
            t = max(t, self._stage_free[stage]) + per_stage
            self._stage_free[stage] = t
        return t

    def _hop_done(self, start: float, hop: float) -> float:
        """When hidden states sent at `start` reach the next stage (KunServe's groups
        share the link with KV exchanges)."""
        return start + hop

    def finish_step(self) -> tuple[StepBatch, StepOutput]:
        batch, result = self._pipeline.popleft()  # batches leave in the order they entered
        self.last_step_end = self.engine.clock.now()
        if self._stage_free[0] > self.engine.clock.now():  # stage 0 still busy: the
            self.hooks.wake_at(self, self._stage_free[0])  # freed slot starts then
        output = self.engine.finish_step(batch, result)
        self.stats.num_steps += 1
        return batch, output

    def next_start_time(self) -> float | None:
        return self._stage_free[0] if len(self._pipeline) < self.num_stages else None


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
