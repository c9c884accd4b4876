"""Pipeline stages on the torch engine: KunServe's dropped-parameter execution.

Design note (KunServe §4, §4.1 "local unified memory management"). When instances merge
into a pipeline group, member k keeps only the contiguous layer slice [s_k, e_k) of the
model; the first stage also keeps the embedding, the last the final norm and LM head.
Each stage's KV pool covers its own layers only, so the memory a member had for KV plus
the weight bytes of the layers it dropped holds

    blocks_k = (kv_bytes_k + dropped_weight_bytes_k) // (n_k * layer_block_bytes)

blocks, where n_k = e_k - s_k: with two halves that is more than twice the blocks of one
unsplit instance. A block id names one slot on every stage (the group has one block
manager: the leader's), so the group's block count is the smallest stage's.

`PipelineExecutor` is an `Executor`: one step flattens the batch once
(andante.exec.torch_inputs), the first stage embeds, each stage runs its layers over
every row and hands the hidden states to the next stage (their bytes are counted as the
activation transfer of a real inter-GPU pipeline), the last stage applies the LM head to
the sampled rows. Sequential (the default), all stages run on the calling thread, in
order; `pipelined`, the step is cut into microbatches (`planner`, andante.exec.
torch_microbatch) that flow through one worker thread per stage, stage k on one
microbatch while stage k+1 runs the previous one (on a CPU the stages share its cores:
the overlap is real, the extra compute is not). Overlapped (`submit` / `next_event`,
driven by andante.engine.overlap's `OverlappedLoop`), the stage threads live across steps
(`StageStream`) and each microbatch's rows complete when it leaves the last stage (its
sampled tokens) or stage 0 (a prompt's inner chunk), so the next step's microbatches
enter stage 0 while earlier ones are still in later stages; with `stage_workers=
"process"` each stage runs in a process of its own instead (andante.exec.
torch_pipeline_procs: the stages run at once, not under one interpreter lock). Each
stage worker runs its share of the executor's intra-op threads (`threads_per_stage`,
andante.exec.torch_microbatch's `stage_threads`: at 2 threads on 2 cores, stage threads
each opening teams of 2 cost 4.4-6.0 ms of CPU per token against 4.2-4.3 at 1 each);
`first_stage_on_caller` computes stage 0 in `submit` instead of on a thread of its own
(one hand-off less per microbatch; off: it did not measure faster). Either
way the split changes
where the memory goes, not the arithmetic. The layers are the unsplit engine's
(`ExactLayer`/`FusedLayer`, `LMHead`, the same RoPE tables), so greedy outputs are
token-identical.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from andante.exec.batch import StepBatch, StepResult
from andante.exec.microbatch import PipelineEvent, RowsDone, completion_rows, rows_step
from andante.exec.torch_attention import decode_path_choice, prefill_matmul_choice
from andante.exec.torch_executor import TorchExecutorOptions
from andante.exec.torch_inputs import InputBuilder, StepInputs
from andante.exec.torch_kv import KVPools
from andante.exec.torch_layer_form import choose_layer_form
from andante.exec.torch_layers import (
    ExactLayer,
    FusedLayer,
    LMHead,
    packed_gemm_supported,
    run_layers,
)
from andante.exec.torch_microbatch import (
    MicrobatchPlanner,
    PipelineTimes,
    StageStream,
    StageWorkers,
    by_rows,
    check_plan,
    stage_threads,
    sub_batch,
)
from andante.exec.torch_pipeline_procs import ProcessStageStream
from andante.exec.torch_pipeline_sleep import PipelineSleep
from andante.exec.torch_sampler import Sampler
from andante.models.loader import LoadedModel, parse_dtype
from andante.models.rope import inverse_frequencies, rope_table
from andante.models.weights import LayerWeights, ModelWeights
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.specs import ModelSpec

LayerSlice = tuple[int, int]
# the overlapped stages' workers: threads, or processes (andante.exec.torch_pipeline_procs)
StageWorkerKind = Literal["thread", "process"]
STAGE_WORKER_KINDS: tuple[str, ...] = ("thread", "process")


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def layer_weight_bytes(w: LayerWeights) -> int:
    return tensor_bytes(w.input_norm, w.qkv, w.qkv_bias, w.o_proj, w.post_norm, w.gate_up,
                        w.down)


def kept_weight_bytes(weights: ModelWeights, layers: LayerSlice) -> int:
    """Weight bytes a member keeps for `layers` of the model: the slice's layers, plus
    the embedding on the first stage and the final norm and LM head on the last (a tied
    head is the embedding itself: counted once)."""
    start, end = layers
    total = sum(layer_weight_bytes(w) for w in weights.layers[start:end])
    first, last = start == 0, end == len(weights.layers)
    if first:
        total += tensor_bytes(weights.embed)
    if last:
        total += tensor_bytes(weights.final_norm)
        if weights.lm_head is not weights.embed or not first:
            total += tensor_bytes(weights.lm_head)
    return total


def layer_block_bytes(model: LoadedModel, dtype: torch.dtype, block_size: int) -> int:
    """Bytes of one KV block of one layer (K and V of every KV head)."""
    config = model.config
    return 2 * config.num_kv_heads * config.head_dim * block_size * dtype.itemsize


@dataclass(frozen=True, slots=True)
class StageMemory:
    """What a member has once it keeps `layers`: its KV budget in bytes (its old KV pool
    plus the weight bytes it dropped) and the blocks that budget holds for its slice."""

    layers: LayerSlice
    kv_bytes: int
    dropped_weight_bytes: int
    num_blocks: int


def stage_memory(model: LoadedModel, options: TorchExecutorOptions, kv_bytes: int,
                 layers: LayerSlice) -> StageMemory:
    """The memory plan of a member that had `kv_bytes` of KV pool and keeps `layers`."""
    dtype = parse_dtype(options.dtype)
    weights = model.weights
    whole = kept_weight_bytes(weights, (0, len(weights.layers)))
    dropped = (whole - kept_weight_bytes(weights, layers)) * dtype.itemsize // max(
        1, weights.dtype.itemsize)
    per_block = (layers[1] - layers[0]) * layer_block_bytes(model, dtype, options.block_size)
    return StageMemory(layers, kv_bytes, dropped, (kv_bytes + dropped) // per_block)


class PipelineStage:
    """Layers [start, end) of the model with their own KV pools (device and host)."""

    def __init__(self, model: LoadedModel, options: TorchExecutorOptions, layers: LayerSlice,
                 num_device_blocks: int, num_host_blocks: int, max_len: int,
                 epilogues: bool | None = None, kv: KVPools | None = None) -> None:
        """`epilogues`: the fused layers' form (andante.exec.torch_layer_form); None:
        the options' `layer_form`, timed now if "auto". `kv`: pools to compute on
        (another process's, in shared memory), else new ones of the given sizes."""
        self.layers_range = layers
        self.max_len = max_len
        if kv is None:
            self._init_kv(model, options, num_device_blocks, num_host_blocks)
        else:
            self.dtype, self.kv = parse_dtype(options.dtype), kv
        self._init_weights(model, options, max_len, epilogues)

    def _init_kv(self, model: LoadedModel, options: TorchExecutorOptions,
                 num_device_blocks: int, num_host_blocks: int) -> None:
        config = model.config
        self.dtype = parse_dtype(options.dtype)
        self.kv = KVPools(self.num_layers, config.num_kv_heads, config.head_dim,
                          options.block_size, num_device_blocks, num_host_blocks, self.dtype)

    def _init_weights(self, model: LoadedModel, options: TorchExecutorOptions,
                      max_len: int, epilogues: bool | None) -> None:
        config, (start, end) = model.config, self.layers_range
        weights = model.weights.to(self.dtype)
        self.fused = packed_gemm_supported(self.dtype)
        if epilogues is None:
            epilogues = stage_layer_form(model, options)
        self.epilogues = epilogues
        self.layers: list[ExactLayer | FusedLayer] = [
            FusedLayer(config, w, self.kv.layer(i), self.kv.layer_slots(i), epilogues)
            if self.fused else ExactLayer(config, w, self.kv.layer(i), self.kv.layer_slots(i))
            for i, w in enumerate(weights.layers[start:end])]
        self.is_first, self.is_last = start == 0, end == config.num_layers
        self.embed = weights.embed if self.is_first else None
        self.lm_head = LMHead(weights.final_norm, weights.lm_head, config.rms_norm_eps,
                              self.fused) if self.is_last else None
        inv_freq = inverse_frequencies(config, weights.rope_freq_factors)
        self.cos, self.sin = rope_table(inv_freq, max_len, weights.dtype)
        self.weight_bytes = kept_weight_bytes(weights, self.layers_range)

    @property
    def num_layers(self) -> int:
        return self.layers_range[1] - self.layers_range[0]

    def holds(self, layer: int) -> bool:
        return self.layers_range[0] <= layer < self.layers_range[1]

    def forward(self, hidden: torch.Tensor | None, inputs: StepInputs) -> torch.Tensor:
        """The first stage takes None (it embeds the step's tokens); the others take the
        previous stage's hidden states. Returns hidden states, or the last stage's
        logits of the sampled rows."""
        x = F.embedding(inputs.input_ids, self.embed) if self.embed is not None else hidden
        assert x is not None, "a middle stage needs the previous stage's activations"
        cos = self.cos.index_select(0, inputs.positions).unsqueeze(1)
        sin = self.sin.index_select(0, inputs.positions).unsqueeze(1)
        x = run_layers(self.layers, x, inputs, cos, sin)
        if self.lm_head is None:
            return x
        return self.lm_head(x.index_select(0, inputs.sample_rows))


@dataclass(slots=True)
class _OpenStep:
    """A step fed to the overlapped pipeline: its tokens as they are sampled."""

    batch: StepBatch
    tokens: list[int | None]
    started: float
    swap_time: float
    parts_sent: int = 0


@dataclass(frozen=True, slots=True)
class _Fed:
    """One microbatch in the overlapped pipeline."""

    step: _OpenStep
    sub: StepBatch
    rows: list[int]  # the step row of each of its rows
    inputs: StepInputs
    done: RowsDone


class PipelineExecutor(PipelineSleep):
    """Runs a model split into `stages` (contiguous, in order, covering every layer);
    see the module note. Counts the activation bytes passed between stages. Sleep mode:
    andante.exec.torch_pipeline_sleep."""

    def __init__(self, model: LoadedModel, options: TorchExecutorOptions,
                 stages: Sequence[PipelineStage], cost_model: CostModel,
                 max_model_len: int, pipelined: bool = False,
                 planner: MicrobatchPlanner | None = None,
                 attention_from: InputBuilder | None = None,
                 stage_workers: StageWorkerKind = "thread") -> None:
        self._init_stages(model, stages)
        self.pipelined = pipelined
        if stage_workers not in STAGE_WORKER_KINDS:
            raise ValueError(f"stage_workers must be one of {STAGE_WORKER_KINDS}, "
                             f"got {stage_workers!r}")
        self.stage_workers = stage_workers
        # the executor's intra-op threads, resolved once (the options', else torch's now,
        # as an unsplit executor resolves them; never the caller's count at a step)
        self.num_threads: int = options.num_threads or torch.get_num_threads()
        # each stage thread's intra-op threads (None: `num_threads` split among the
        # stages, andante.exec.torch_microbatch's `stage_threads`; 0: all `num_threads`)
        self.threads_per_stage: int | None = None
        # overlapped: stage 0 on the caller's thread (`StageStream`'s first_on_caller)
        self.first_stage_on_caller = False
        self.planner: MicrobatchPlanner = planner or by_rows
        self.workers = StageWorkers(len(self.stages), self._run_stage)
        self._count_lock = threading.Lock()
        self.options = options
        self.model = model
        self.cost_model = cost_model
        self.max_model_len = max_model_len
        self.dtype = parse_dtype(options.dtype)
        config = model.config
        self.inputs = InputBuilder(options.block_size, max_model_len, config.num_kv_heads,
                                   config.num_heads // config.num_kv_heads, self.dtype)
        if attention_from is not None:  # the members' own paths: token-identical to them
            self.inputs.copy_attention_paths(attention_from)
        else:  # chosen as an unsplit executor chooses them
            path = decode_path_choice(options.decode_attention, config.num_heads,
                                      config.num_kv_heads, config.head_dim, self.dtype,
                                      options.block_size)[0]
            self.inputs.decode_matmul = path != "sdpa"
            self.inputs.decode_native = path == "matmul_native"
            self.inputs.prefill_matmul = prefill_matmul_choice(
                options.prefill_attention, config.num_heads, config.num_kv_heads,
                config.head_dim, self.dtype)[0]
        self.sampler = Sampler(options.seed)
        self.activation_bytes = 0
        self.num_activation_transfers = 0
        self._init_overlap()

    def _init_overlap(self) -> None:
        self._stream: StageStream | ProcessStageStream | None = None
        self._fed: dict[int, _Fed] = {}
        self._failure: BaseException | None = None  # a stage's error (`_fail`)
        self._next_index = 0
        self._open_since = 0.0
        # the shapes of the last `num_stages` microbatches fed (lookahead's balance)
        self.recent_shapes: deque[BatchShape] = deque(maxlen=len(self.stages))

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def replace_stages(self, stages: Sequence[PipelineStage]) -> None:
        """Run on `stages` from the next step (a group grew or shrank: andante.exec.
        torch_regroup); the pipeline's times so far are kept. Stage workers that were
        running are started again over the new stages (processes: now, not at the next
        step's first microbatch)."""
        times = self.workers.times
        if self._fed:
            raise RuntimeError("replace_stages with microbatches in flight")
        running = self._stream is not None
        self.close()
        self._init_stages(self.model, stages)
        self.recent_shapes = deque(self.recent_shapes, maxlen=len(self.stages))
        self.workers = StageWorkers(len(self.stages), self._run_stage)
        self.workers.times.carry(times)
        if running:
            self.start_workers()

    def _init_stages(self, model: LoadedModel, stages: Sequence[PipelineStage]) -> None:
        expected = 0
        for stage in stages:
            if stage.layers_range[0] != expected:
                raise ValueError(f"stages must cover the layers in order, got "
                                 f"{[s.layers_range for s in stages]}")
            expected = stage.layers_range[1]
        if expected != model.config.num_layers or not stages:
            raise ValueError(f"stages cover {expected} of {model.config.num_layers} layers")
        self.stages = list(stages)

    @property
    def spec(self) -> ModelSpec:
        return self.model.config.with_dtype(self.dtype.itemsize, self.model.name)

    def stage_of(self, layer: int) -> PipelineStage:
        return next(s for s in self.stages if s.holds(layer))

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        if block_size != self.options.block_size:
            raise ValueError(f"executor block size {self.options.block_size} != "
                             f"scheduler block size {block_size}")
        return (min(s.kv.num_device_blocks for s in self.stages),
                min(s.kv.num_host_blocks for s in self.stages))

    @property
    def pipeline_times(self) -> PipelineTimes:
        return self.workers.times

    def execute(self, batch: StepBatch) -> StepResult:
        self._check_awake()
        started = time.perf_counter()
        swap_time = sum(s.kv.swap(batch.swap_out, batch.swap_in) for s in self.stages)
        sampled: list[int | None] = [None] * len(batch.requests)
        if batch.requests and self.pipelined:
            self._execute_pipelined(batch, sampled)
        elif batch.requests:
            with torch.inference_mode():
                inputs = self.inputs.build(batch)
                x: torch.Tensor | None = None
                for stage in self.stages:
                    if x is not None:  # the activation transfer to the next member
                        self.activation_bytes += tensor_bytes(x)
                        self.num_activation_transfers += 1
                    x = stage.forward(x, inputs)
                assert x is not None
                if inputs.sample_index:
                    owners = [batch.requests[i] for i in inputs.sample_index]
                    for i, token in zip(inputs.sample_index, self.sampler.sample(x, owners),
                                        strict=True):
                        sampled[i] = token
        return StepResult(sampled, time.perf_counter() - started, swap_time)

    def _execute_pipelined(self, batch: StepBatch, sampled: list[int | None]) -> None:
        plan = self.planner(batch, len(self.stages))
        check_plan(batch, plan)
        parts = [sub_batch(batch, pieces) for pieces in plan]
        with torch.inference_mode():
            inputs = [self.inputs.build(sub) for sub, _ in parts]
            self.workers.threads = self.stage_thread_count()
            logits = self.workers.run(inputs)
            for (sub, rows), step_inputs, x in zip(parts, inputs, logits, strict=True):
                if not step_inputs.sample_index:
                    continue
                owners = [sub.requests[i] for i in step_inputs.sample_index]
                for i, token in zip(step_inputs.sample_index,
                                    self.sampler.sample(x, owners), strict=True):
                    sampled[rows[i]] = token

    # ---- overlapped steps (andante.engine.overlap's MicrobatchPipeline) --------------
    def submit(self, batch: StepBatch, num_slots: int) -> int:
        """Swap, cut `batch` into at most `num_slots` microbatches (`planner`) and feed
        them to stage 0; returns how many."""
        self._check_awake()
        if self._failure is not None:
            raise self._failure
        started = time.perf_counter()
        swap_time = sum(s.kv.swap(batch.swap_out, batch.swap_in) for s in self.stages)
        if not batch.requests:
            return 0
        plan = self.planner(batch, num_slots)
        check_plan(batch, plan)
        step = _OpenStep(batch, [None] * len(batch.requests), started, swap_time)
        if self._stream is None:
            self._stream = self._new_stream()
        if not self._fed:
            self._open_since = started
        with torch.inference_mode():
            for pieces, done in zip(plan, completion_rows(batch, plan), strict=True):
                sub, rows = sub_batch(batch, pieces)
                fed = _Fed(step, sub, rows, self.inputs.build(sub), done)
                index, self._next_index = self._next_index, self._next_index + 1
                self._fed[index] = fed
                self._stream.feed(index, fed.inputs)
                self.recent_shapes.append(sub.shape())
        times = self.workers.times
        times.num_steps += 1
        times.num_microbatches += len(plan)
        return len(plan)

    def in_flight_ids(self) -> set[str]:
        """The requests with a piece in a microbatch still in the pipeline."""
        return {r.request_id for fed in self._fed.values() for r in fed.sub.requests}

    def next_event(self) -> PipelineEvent:
        """The next microbatch out of stage 0 or the last stage, with the step rows it
        completes (andante.exec.microbatch's `completion_rows`)."""
        if self._failure is not None:
            raise self._failure
        if self._stream is None or not self._fed:
            raise RuntimeError("next_event with nothing in the pipeline")
        try:
            index, last_stage, logits = self._stream.next_event()
        except BaseException as exc:
            self._fail(exc)
            raise
        fed = self._fed[index]
        step = fed.step
        if last_stage:
            del self._fed[index]
            self._sample(fed, logits)
            rows = fed.done.sampling
        else:
            rows = fed.done.ordered
        now = time.perf_counter()
        sub, result = rows_step(step.batch, step.tokens, rows, now - step.started,
                                step.parts_sent == 0, step.swap_time)
        step.parts_sent += 1  # the step's swaps went with its first part, rows or not
        if not self._fed:
            self._close_span(now)
            self._count_process_transfers()
        return PipelineEvent(sub, result, last_stage)

    def _new_stream(self) -> StageStream | ProcessStageStream:
        if self.stage_workers == "process":
            return ProcessStageStream(self.model, self.options, self.stages,
                                      self.workers.times, self.stage_thread_count())
        return StageStream(len(self.stages), self._run_stage, self.workers.times,
                           self.stage_thread_count(), self.first_stage_on_caller)

    def stage_thread_count(self) -> int:
        """Each stage worker's intra-op threads, always an explicit count: a stage
        thread's `set_num_threads` is also the default of threads started after it
        (torch 2.13), so "leave torch's count" would be whatever a thread set last."""
        if self.threads_per_stage is None:
            return stage_threads(self.num_threads, len(self.stages))
        return self.threads_per_stage or self.num_threads

    def start_workers(self) -> None:
        """Start the overlapped stages' workers now rather than at the first
        microbatch (stage processes take seconds to start)."""
        if self._stream is None:
            self._stream = self._new_stream()
        if isinstance(self._stream, ProcessStageStream):
            self._stream.start()

    def close(self) -> None:
        if self._stream is not None:
            self._count_process_transfers()
            self._stream.close()
            self._stream = None

    def _count_process_transfers(self) -> None:
        stream = self._stream
        if isinstance(stream, ProcessStageStream):
            self.activation_bytes += stream.activation_bytes
            self.num_activation_transfers += stream.num_activation_transfers
            stream.activation_bytes = stream.num_activation_transfers = 0

    def _fail(self, exc: BaseException) -> None:
        """A stage raised: the pipeline is broken for good. Every later `submit` or
        `next_event` raises the same error at once (none waits for a microbatch that the
        failed stage dropped), and what was in flight is forgotten."""
        self._failure = exc
        self._fed.clear()
        self.close()

    def _sample(self, fed: _Fed, logits: torch.Tensor) -> None:
        index = fed.inputs.sample_index
        if not index:
            return
        owners = [fed.sub.requests[i] for i in index]
        with torch.inference_mode():
            tokens = self.sampler.sample(logits, owners)
        for i, token in zip(index, tokens, strict=True):
            fed.step.tokens[fed.rows[i]] = token

    def _close_span(self, now: float) -> None:
        times = self.workers.times
        span = now - self._open_since
        times.span += span
        times.capacity += span * len(self.stages)

    def _run_stage(self, k: int, hidden: torch.Tensor | None, inputs: StepInputs
                   ) -> torch.Tensor:
        if hidden is not None:  # the activation transfer from the previous member
            with self._count_lock:
                self.activation_bytes += tensor_bytes(hidden)
                self.num_activation_transfers += 1
        return self.stages[k].forward(hidden, inputs)


def group_num_blocks(model: LoadedModel, options: TorchExecutorOptions,
                     slices: Sequence[LayerSlice], kv_bytes: Sequence[int]) -> int:
    """The group's block count when member k keeps `slices[k]` and brings `kv_bytes[k]`
    of KV memory: the smallest stage's (see the module note)."""
    return min(stage_memory(model, options, b, s).num_blocks
               for s, b in zip(slices, kv_bytes, strict=True))


def stage_layer_form(model: LoadedModel, options: TorchExecutorOptions) -> bool:
    """Whether fused stages use epilogues: the options' `layer_form`, timed if "auto"."""
    dtype = parse_dtype(options.dtype)
    if not packed_gemm_supported(dtype):
        return True
    return choose_layer_form(options.layer_form, model.config, dtype)[0]


def pipeline_executor(model: LoadedModel, options: TorchExecutorOptions,
                      slices: Sequence[LayerSlice], kv_bytes: Sequence[int],
                      cost_model: CostModel, max_model_len: int,
                      num_host_blocks: int, pipelined: bool = False,
                      planner: MicrobatchPlanner | None = None,
                      attention_from: InputBuilder | None = None,
                      stage_workers: StageWorkerKind = "thread") -> PipelineExecutor:
    """A pipeline over `slices`, member k bringing `kv_bytes[k]` of KV memory; every
    stage gets the group's block count (the smallest stage's, see the module note).
    `attention_from`: the members' input builder, whose attention paths the stages take
    (else they are chosen as an unsplit executor chooses them)."""
    num_blocks = group_num_blocks(model, options, slices, kv_bytes)
    epilogues = stage_layer_form(model, options)  # one form for every stage
    stages = [PipelineStage(model, options, s, num_blocks, num_host_blocks, max_model_len,
                            epilogues) for s in slices]
    return PipelineExecutor(model, options, stages, cost_model, max_model_len, pipelined,
                            planner, attention_from, stage_workers)


def device_kv_bytes(num_device_blocks: int, model: LoadedModel,
                    options: TorchExecutorOptions) -> int:
    """Bytes of an unsplit executor's device KV pool of `num_device_blocks` blocks."""
    dtype = parse_dtype(options.dtype)
    return num_device_blocks * model.config.num_layers * layer_block_bytes(
        model, dtype, options.block_size)

