"""How many threads a step uses: measured at start-up, not guessed.

Design note. A decode step streams every weight once through GEMVs; whether a second
OpenMP thread pays depends on the machine: on a quiet multi-core CPU two threads get
more memory bandwidth, while on a shared one (or with OMP_WAIT_POLICY=PASSIVE, where
the second thread sleeps between parallel regions and is woken for each of the ~150
kernels of a step) it costs more than it gains. So the executor times synthetic
decode steps of a few batch sizes on one thread and on all of them, interleaved (so a
burst of outside load hits both alike), and steps below the smallest batch size from
which all threads win every larger measured size run on one thread. The synthetic
steps attend to context 128 in a few KV blocks that no request owns yet, so they leave
nothing behind. Prefill-sized steps (>= the largest probe) always use all threads.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from andante.core import Request, SamplingParams
from andante.exec.batch import StepBatch

#: Decode batch sizes probed at start-up, and the context length of each probe.
PROBE_BATCHES = (1, 8, 16)
PROBE_CONTEXT = 128


@dataclass(slots=True)
class ThreadChoice:
    """Steps with fewer than `parallel_min_tokens` tokens run on one thread; `timings`
    maps each probed batch size to (median ms on one thread, on all threads)."""

    parallel_min_tokens: int | None
    timings: dict[int, tuple[float, float]] = field(default_factory=dict)


def probe_batch(batch_size: int, block_size: int, context: int) -> StepBatch:
    """A decode step of `batch_size` synthetic requests at `context`, all sharing the
    first blocks of the pool (reads and writes only: no request owns them yet)."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    prompt = [0] * (context + 1)
    table = list(range(-(-(context + 1) // block_size)))
    batch = StepBatch()
    for i in range(batch_size):
        batch.add(Request(f"thread-probe-{i}", prompt, params, 0.0), 1, context, True, table)
    return batch


def _timed_ms(run: Callable[[], object], threads: int) -> float:
    torch.set_num_threads(threads)
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1e3


def measure_thread_choice(step: Callable[[StepBatch], object], block_size: int,
                          num_threads: int, max_context: int,
                          rounds: int = 5) -> ThreadChoice:
    """Time `step` on each probe batch with one and with `num_threads` threads: one
    warm-up each (oneDNN builds its primitives per thread count), then `rounds`
    interleaved timings; medians. Probes attend to min(PROBE_CONTEXT, `max_context`)."""
    if num_threads <= 1:
        return ThreadChoice(None)
    context = max(1, min(PROBE_CONTEXT, max_context))
    runs = {b: partial(step, probe_batch(b, block_size, context)) for b in PROBE_BATCHES}
    samples: dict[int, tuple[list[float], list[float]]] = {b: ([], []) for b in PROBE_BATCHES}
    for run in runs.values():
        _timed_ms(run, 1)
        _timed_ms(run, num_threads)
    for _ in range(rounds):
        for size, run in runs.items():
            samples[size][0].append(_timed_ms(run, 1))
            samples[size][1].append(_timed_ms(run, num_threads))
    torch.set_num_threads(num_threads)
    timings = {b: (round(statistics.median(one), 2), round(statistics.median(many), 2))
               for b, (one, many) in samples.items()}
    return ThreadChoice(_threshold(timings), timings)


def _threshold(timings: dict[int, tuple[float, float]]) -> int:
    """The smallest probed size from which all threads win at every larger probe."""
    threshold = 2 * max(timings)
    for size in sorted(timings, reverse=True):
        one, many = timings[size]
        if many >= one:
            break
        threshold = size
    return threshold
