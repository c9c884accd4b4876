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

The probe takes about 1.5 s on a quiet machine and 6-12 s under load, so its result is
cached per machine under the andante home (`threads/<digest>.json`), keyed by what the
choice depends on: CPU model, core count, thread count, OpenMP wait policy, torch
version and the model's shape (layers, widths, dtype, block size, probe context). A
cached choice is reused as it is; `reprobe=True` (the executor's `reprobe_threads`
option, or `ANDANTE_REPROBE_THREADS=1`) measures again and replaces it, e.g. after the
machine's load changed for good. An unreadable cache entry is measured again; an
unwritable home only costs the next start-up another probe. A probe taken beside other
work is used for that run only and not cached: a busy machine's choice (one thread for
small steps) would otherwise stick after the load is gone. "Beside other work" is
measured during the probe itself from /proc/stat (andante.exec.cpu_share: other
processes' CPU share of the machine while the probe ran, at least IDLE_OTHERS_SHARE),
not from the 1-minute load average, which lags a neighbour that started seconds ago
and is the fallback only where /proc/stat is missing. While serving, the thread count
of each step size keeps adapting to the CPU the engine gets (andante.exec.thread_adapter).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import torch

from andante.core import Request, SamplingParams
from andante.exec.batch import StepBatch
from andante.exec.cpu_share import (
    IDLE_OTHERS_SHARE,
    CpuTimes,
    measure_others_share,
    read_cpu_times,
)
from andante.perf.paths import andante_home, env_switch, write_json_atomically

log = logging.getLogger(__name__)

#: Bump when the probe's method changes, so that older cached choices are measured again.
PROBE_VERSION = 4  # 2: TorchScript layers; 3: cached only when measured idle (/proc/stat);
# 4: small decode batches attend on one thread (andante.exec.thread_scope)
REPROBE_ENV = "ANDANTE_REPROBE_THREADS"

#: Decode batch sizes probed at start-up, and the context length of each probe.
PROBE_BATCHES = (1, 8, 16)
PROBE_CONTEXT = 128


@dataclass(slots=True)
class ThreadChoice:
    """Steps with fewer than `parallel_min_tokens` tokens run on one thread; `timings`
    maps each probed batch size to (median ms on one thread, on all threads)."""

    parallel_min_tokens: int | None
    timings: dict[int, tuple[float, float]] = field(default_factory=dict)
    source: str = "set"  # "set" by an option, "measured" now, or "cached" from a file

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.parallel_min_tokens is None:
            rule = "every step uses all threads"
        else:
            rule = f"steps under {self.parallel_min_tokens} tokens run on one thread"
        probes = ", ".join(f"b{b} {one}/{many} ms" for b, (one, many) in self.timings.items())
        return f"{rule} ({self.source}{'; 1 vs all threads: ' + probes if probes else ''})"


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


def probe_context(max_context: int) -> int:
    """The context the probes attend to when the pool and model allow `max_context`."""
    return max(1, min(PROBE_CONTEXT, max_context))


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
        return ThreadChoice(None, source="one thread")
    context = probe_context(max_context)
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
    return ThreadChoice(_threshold(timings), timings, "measured")


def _threshold(timings: dict[int, tuple[float, float]]) -> int:
    """The smallest probed size from which all threads win at every larger probe."""
    return all_threads_from(timings, beyond=2 * max(timings))


def all_threads_from(timings: dict[int, tuple[float, float]], beyond: int) -> int:
    """The smallest timed size from which all threads win at every larger timed size
    (`timings`: size -> (one thread, all threads)); `beyond` where one thread wins at
    the largest."""
    threshold = beyond
    for size in sorted(timings, reverse=True):
        one, many = timings[size]
        if many >= one:
            break
        threshold = size
    return threshold


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what `platform` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_key(model_shape: dict[str, Any], num_threads: int) -> dict[str, Any]:
    """Everything a thread choice depends on; the cache entry's identity."""
    return {"probe_version": PROBE_VERSION, "cpu": cpu_model(), "cores": os.cpu_count(),
            "threads": num_threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "torch": torch.__version__, "model": model_shape}


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return andante_home() / "threads" / f"{digest}.json"


def reprobe_requested(option: bool) -> bool:
    """The option, or $ANDANTE_REPROBE_THREADS set to anything but "" / "0"."""
    return option or env_switch(REPROBE_ENV)


def _load(path: Path, key: dict[str, Any]) -> ThreadChoice | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry["key"] != key:
            return None
        threshold = entry["parallel_min_tokens"]
        timings = {int(b): (float(t[0]), float(t[1])) for b, t in entry["timings"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if threshold is not None and (not isinstance(threshold, int) or threshold < 1):
        return None
    return ThreadChoice(threshold, timings, f"cached {path}, probed {entry.get('probed_at')}")


def _save(path: Path, key: dict[str, Any], choice: ThreadChoice,
          others_share: float | None) -> None:
    entry = {"key": key, "parallel_min_tokens": choice.parallel_min_tokens,
             "timings": {str(b): list(t) for b, t in choice.timings.items()},
             "probed_at": datetime.now(UTC).isoformat(timespec="seconds"),
             "others_cpu_share": None if others_share is None else round(others_share, 3),
             "loadavg_1m": round(machine_load(), 2)}
    try:
        write_json_atomically(path, entry)
    except OSError as exc:
        log.warning("threads: cannot cache the probe's choice in %s (%s)", path, exc)


def machine_load() -> float:
    """The 1-minute load average (0 where the platform has none): only the fallback
    where /proc/stat cannot be read (it lags, and counts our own threads)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def machine_is_busy(load: float, cores: int | None = None) -> bool:
    """Whether a load average says other work loads the machine (the fallback test)."""
    return load >= 0.5 * (cores or os.cpu_count() or 1)


def cached_thread_choice(measure: Callable[[], ThreadChoice], key: dict[str, Any],
                         reprobe: bool = False,
                         cpu_times: Callable[[], CpuTimes | None] | None = None,
                         ) -> ThreadChoice:
    """The cached choice for `key`, else `measure()`, cached only when the machine was
    idle while it ran: other processes used under IDLE_OTHERS_SHARE of the CPU meanwhile,
    read from /proc/stat by `cpu_times` (default `read_cpu_times`; where it reads
    nothing, the 1-minute load average at the start decides). `reprobe` measures even
    when a choice is cached, and replaces it."""
    path = cache_path(key)
    if not reprobe_requested(reprobe):
        cached = _load(path, key)
        if cached is not None:
            return cached
    load = machine_load()
    started = time.perf_counter()
    choice, share = measure_others_share(measure, cpu_times or read_cpu_times)
    took = f"measured in {time.perf_counter() - started:.1f} s"
    if share is not None:
        busy, beside = share >= IDLE_OTHERS_SHARE, f"others' CPU share {share:.2f}"
    else:
        busy, beside = machine_is_busy(load), f"load average {load:.1f}"
    if busy:
        choice.source = f"{took} beside other work ({beside}), not cached"
        return choice
    choice.source = f"{took} ({beside}), cached in {path}"
    _save(path, key, choice, share)
    return choice
