"""Start-up warm-up of the step-size buckets: every bucket's GEMM primitives built once.

Design note. oneDNN builds (and JIT-compiles) a GEMM primitive the first time it meets
a row count, 8-25 ms per step size below 384 tokens on this CPU, more above
(andante.perf.step_sizes). The executor pads each step's rows to a bucket, so a serving
process meets only the buckets up to its step budget; here it meets all of them before
the first request, as vLLM warms its model at start-up (a dummy run at the largest
batch; its GPU build captures one graph per batch-size bucket, `cudagraph_capture_sizes`).

One synthetic step per bucket B runs through the executor's own forward pass (the same
inputs builder, padding and scripted layers, at the thread count a real step of B rows
gets), on the first layer only: all layers share the GEMM shapes, and oneDNN's primitive
cache is keyed by shape and attributes, not by the weights, so one layer builds the
primitives of all thirty at 1/30 of the arithmetic (measured with ONEDNN_VERBOSE=2: no
layer's GEMM missed the cache after the warm-up). The step is ceil(B / max_len) fresh
synthetic prompts. The LM head runs on the sampled rows, whose count S is bucketed too
but runs at the thread count of the whole step: it is warmed apart, every S bucket up to
`max_seqs` (the most rows a step samples) at every thread count a step sampling S rows
can run at (all threads; one thread too where S is below the executor's threshold).
Their K/V goes to the first blocks of the pool, which no request owns yet: the warm-up
runs before the engine serves anything. The primitive cache must hold every bucket
(`primitive_cache_entries`); its capacity is read from `ONEDNN_PRIMITIVE_CACHE_CAPACITY`
when oneDNN builds its first primitive, so `primitive_cache_for` sets it (unless the user
did) while the executor packs its weights. A process whose oneDNN already built a
primitive before (an earlier executor) keeps the capacity it started with.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from andante.core import Request, SamplingParams
from andante.exec.batch import StepBatch
from andante.perf.step_sizes import StepBuckets, primitive_cache_entries

log = logging.getLogger(__name__)

PRIMITIVE_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


@dataclass(frozen=True, slots=True)
class WarmUp:
    """What the warm-up ran: the buckets (row counts) and the seconds it took."""

    sizes: tuple[int, ...]
    seconds: float

    def describe(self) -> str:
        if not self.sizes:
            return "step buckets: no warm-up"
        return (f"step buckets: warmed {len(self.sizes)} sizes (1..{self.sizes[-1]} rows) "
                f"in {self.seconds:.1f} s")


@contextmanager
def primitive_cache_for(num_buckets: int) -> Iterator[int]:
    """Within the block, `ONEDNN_PRIMITIVE_CACHE_CAPACITY` asks for room for
    `num_buckets` warmed sizes, unless the environment sets a capacity already; yields
    the capacity asked for. oneDNN reads it once, when it creates its first primitive
    (the executor's first weight packing, inside the block); the environment is
    restored after it, so that nothing else in the process sees the change."""
    wanted = primitive_cache_entries(num_buckets)
    current = os.environ.get(PRIMITIVE_CACHE_ENV)
    if current:
        if not current.isdigit() or int(current) < wanted:
            log.warning("%s=%s is below the %d entries %d step buckets need: sizes may be "
                        "rebuilt while serving", PRIMITIVE_CACHE_ENV, current, wanted,
                        num_buckets)
        yield int(current) if current.isdigit() else 0
        return
    os.environ[PRIMITIVE_CACHE_ENV] = str(wanted)
    try:
        yield wanted
    finally:
        if current is None:
            os.environ.pop(PRIMITIVE_CACHE_ENV, None)
        else:
            os.environ[PRIMITIVE_CACHE_ENV] = current


def warmup_batch(num_rows: int, max_len: int, block_size: int, num_blocks: int) -> StepBatch:
    """A step of `num_rows` rows: ceil(num_rows / max_len) fresh synthetic prompts, each
    sampled, written to the first of the pool's `num_blocks` blocks."""
    num_seqs = -(-num_rows // max_len)
    base, extra = divmod(num_rows, num_seqs)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    batch = StepBatch()
    for i in range(num_seqs):
        length = base + (1 if i < extra else 0)
        table = [b % num_blocks for b in range(-(-length // block_size))]
        request = Request(f"warmup-{num_rows}-{i}", [0] * length, params, 0.0)
        batch.add(request, length, 0, True, table)
    return batch


def lm_head_thread_counts(num_sampled: int, parallel_min_tokens: int | None,
                          num_threads: int) -> list[int]:
    """The thread counts a step sampling `num_sampled` rows can run at: steps of fewer
    than `parallel_min_tokens` rows run on one thread (andante.exec.torch_threads)."""
    if parallel_min_tokens is None or num_threads == 1:
        return [num_threads]
    return [1, num_threads] if num_sampled < parallel_min_tokens else [num_threads]


@dataclass(frozen=True, slots=True)
class WarmUpPlan:
    """What to warm: every body bucket up to `max_tokens` rows (prompts of at most
    `max_len` tokens in a pool of `num_blocks` blocks of `block_size`), every LM-head
    bucket up to `max_seqs` rows."""

    buckets: StepBuckets
    max_tokens: int
    max_seqs: int
    max_len: int
    block_size: int
    num_blocks: int


def warm_buckets(step: Callable[[StepBatch], object], lm_head: Callable[[int, int], object],
                 threads_of: Callable[[int], list[int]], plan: WarmUpPlan) -> WarmUp:
    """Run `step` once on a warm-up batch of every bucket up to `plan.max_tokens` rows,
    then `lm_head(rows, threads)` for every LM-head bucket at each of `threads_of(rows)`."""
    started = time.perf_counter()
    sizes = tuple(plan.buckets.sizes(plan.max_tokens))
    for size in sizes:
        step(warmup_batch(size, plan.max_len, plan.block_size, plan.num_blocks))
    for rows in plan.buckets.sizes(plan.max_seqs):
        for threads in threads_of(rows):
            lm_head(rows, threads)
    return WarmUp(sizes, time.perf_counter() - started)
