"""SimExecutor: synthetic tokens and a step duration predicted by the cost model.

Swaps cost bytes / host-link bandwidth. By default they are on the step's critical
path (as in vLLM, which swaps synchronously before the forward pass); with
`overlap_swaps=True` they run on a separate copy engine (FastServe §4.2's overlapped
swapping): copies whose blocks the step's forward pass uses (a swap-in of a request it
runs, a swapped-out block it reuses) must finish first; the others overlap the forward
pass and only the part longer than it delays the step.

A CPU profile with a new-size setup (andante.perf.step_sizes) stands for andante's CPU
engine, which pads each step to a step-size bucket and warms every bucket at start-up:
the simulated instance then charges each step at its bucket's token count (and LM-head
rows), the setup once per bucket, none for the buckets up to `warmup_tokens` (the real
engine's warm-up limit: its max_model_len by default), in a size cache raised as the
real engine raises oneDNN's. `step_buckets="auto"` follows the profile and
$ANDANTE_NO_STEP_BUCKETS as the real engine does; None: no buckets.
"""

from __future__ import annotations

from typing import Literal

from andante.exec.batch import StepBatch, StepResult
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.step_sizes import (
    StepBuckets,
    StepSizeCache,
    bucket_cache_sizes,
    engine_buckets,
    padded_shape,
)

GIB = 1 << 30


class SimExecutor:
    def __init__(
        self,
        cost_model: CostModel,
        block_size: int = 16,
        host_kv_bytes: int = 4 * GIB,
        gpu_memory_utilization: float = 0.9,
        overlap_swaps: bool = False,
        token_id: int = 0,
        step_buckets: StepBuckets | Literal["auto"] | None = "auto",
        warmup_tokens: int | None = None,
        num_device_blocks: int | None = None,
    ) -> None:
        self.cost_model = cost_model
        self.block_size = block_size
        self.host_kv_bytes = host_kv_bytes
        self.gpu_memory_utilization = gpu_memory_utilization
        self.overlap_swaps = overlap_swaps
        self.token_id = token_id
        if num_device_blocks is not None and num_device_blocks < 1:
            raise ValueError(f"num_device_blocks must be >= 1, got {num_device_blocks}")
        self.num_device_blocks = num_device_blocks  # None: what the memory leaves
        self._init_step_sizes(step_buckets, warmup_tokens)

    def _init_step_sizes(self, step_buckets: StepBuckets | Literal["auto"] | None,
                         warmup_tokens: int | None) -> None:
        hardware = self.cost_model.hardware
        buckets = engine_buckets(hardware) if step_buckets == "auto" else step_buckets
        self.step_buckets: StepBuckets | None = (
            buckets if isinstance(buckets, StepBuckets) and hardware.new_size_cache else None)
        capacity = hardware.new_size_cache
        warm = (self.step_buckets.sizes(warmup_tokens)
                if self.step_buckets is not None and warmup_tokens else [])
        if warm:
            capacity = max(capacity, bucket_cache_sizes(len(warm)))
        self.step_sizes = StepSizeCache(capacity)
        self.step_sizes.warm(warm)

    def _shape(self, shape: BatchShape) -> BatchShape:
        """The shape the engine runs: padded to its buckets, where it has them."""
        return shape if self.step_buckets is None else padded_shape(shape, self.step_buckets)

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        if block_size != self.block_size:
            raise ValueError(f"executor block size {self.block_size} != scheduler {block_size}")
        host_tokens = self.host_kv_bytes // self.cost_model.model.kv_bytes_per_token
        if self.num_device_blocks is not None:  # vLLM's --num-gpu-blocks-override
            return self.num_device_blocks, host_tokens // block_size
        device_tokens = self.cost_model.kv_capacity_tokens(self.gpu_memory_utilization)
        return device_tokens // block_size, host_tokens // block_size

    def execute(self, batch: StepBatch) -> StepResult:
        forward = 0.0
        if batch.requests:
            shape = self._shape(batch.shape())
            forward = self.cost_model.step_time(shape)
            if self.step_sizes.capacity:
                forward += self._new_size(shape.num_tokens)
        num_swapped = len(batch.swap_out) + len(batch.swap_in)
        swap = self.cost_model.swap_time(num_swapped * self.block_size) if num_swapped else 0.0
        if not self.overlap_swaps:
            duration = forward + swap
        elif not num_swapped:
            duration = forward
        else:
            needed = self.cost_model.swap_time(self._num_needed_blocks(batch) * self.block_size)
            duration = needed + max(forward, swap - needed)
        token = self.token_id
        sampled: list[int | None] = [token if s else None for s in batch.samples]
        return StepResult(sampled_token_ids=sampled, duration=duration, swap_time=swap)

    def forward_time(self, batch: StepBatch) -> float:
        """The cost model's forward pass of `batch` as this executor runs it (padded to
        its buckets, where it has them; no swaps, no new-size setup)."""
        return self.cost_model.step_time(self._shape(batch.shape())) if batch.requests else 0.0

    def _new_size(self, num_tokens: int) -> float:
        """The setup a step of `num_tokens` pays now (0 where that size is warm)."""
        if not self.step_sizes.miss(num_tokens):
            return 0.0
        return self.cost_model.new_size_time(num_tokens)

    @staticmethod
    def _num_needed_blocks(batch: StepBatch) -> int:
        """Swapped blocks the forward pass touches: they are copied before it starts."""
        touched = {b for table in batch.block_tables for b in table}
        if not touched:
            return 0
        num_in = sum(1 for _, dst in batch.swap_in if dst in touched)
        return num_in + sum(1 for src, _ in batch.swap_out if src in touched)

    def decode_run_durations(
        self, batch: StepBatch, max_steps: int, time_budget: float
    ) -> list[float]:
        """See `andante.exec.base.DecodeRunExecutor`."""
        shape = self._shape(BatchShape.decodes([req.num_computed_tokens
                                                for req in batch.requests]))
        if self.step_sizes.capacity:
            if self.step_sizes.is_new(shape.num_tokens):
                return []  # the first step of a new size: stepped, so `execute` charges it
            self.step_sizes.miss(shape.num_tokens)
        return self.cost_model.decode_step_times(shape, max_steps, time_budget)

    def prefill_run_durations(self, shapes: list[BatchShape], time_budget: float) -> list[float]:
        """See `andante.exec.base.DecodeRunExecutor`."""
        step_time = self.cost_model.step_time
        durations: list[float] = []
        total = 0.0
        sizes = self.step_sizes if self.step_sizes.capacity else None
        for real in shapes:
            if total >= time_budget:
                break
            shape = self._shape(real)
            if sizes is not None:
                if sizes.is_new(shape.num_tokens):
                    break  # as in `decode_run_durations`
                sizes.miss(shape.num_tokens)
            duration = step_time(shape)
            durations.append(duration)
            total += duration
        return durations
