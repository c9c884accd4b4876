"""Per-GEMM timing shared by benchmarks/gemm_paths.py and the vLLM peer's
benchmarks/vllm_peer/onednn_gemm.py (which runs under vLLM's interpreter, so this file
imports nothing from andante).

`SHAPES`: SmolLM2-135M's dense projections as (name, K, N). `time_call` runs a callable
`reps` times per round over `rounds` rounds and returns the median and the best round's
microseconds per call, wall and process CPU. `cycling` over `copies_for` copies of a
weight measures it "cold" (streamed from memory, as in a decode step) rather than warm.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

#: SmolLM2-135M (hidden 576, 9 + 2 * 3 heads of 64, intermediate 1536, vocabulary 49,152).
SHAPES: tuple[tuple[str, int, int], ...] = (
    ("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576),
    ("lm_head", 576, 49152),
)


def reps_for(m: int, k: int, n: int) -> int:
    """Calls per round: about 20 MFLOP of work per round, at least 3 calls."""
    return max(3, min(200, int(2e7 / (2 * m * k * n))))


def time_call(fn: Callable[[], Any], reps: int, rounds: int) -> dict[str, float]:
    for _ in range(max(2, reps // 4)):
        fn()
    walls, cpus = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(reps):
            fn()
        walls.append((time.perf_counter() - w0) / reps * 1e6)
        cpus.append((time.process_time() - c0) / reps * 1e6)
    return {"wall_us": round(statistics.median(walls), 1), "best_wall_us": round(min(walls), 1),
            "cpu_us": round(statistics.median(cpus), 1)}


#: Bytes of weight copies a "cold" measurement cycles through: past this CPU's 32 MiB L3,
#: so each call streams its weight from memory, as a decode step's layers do.
COLD_BYTES = 96 << 20


def copies_for(weight_bytes: int, cold: bool) -> int:
    """How many copies of one weight a measurement cycles through (1: warm in cache)."""
    return max(1, -(-COLD_BYTES // weight_bytes)) if cold else 1


def cycling(calls: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One callable that runs `calls` in turn, one per call."""
    state = {"i": 0}

    def step() -> Any:
        i = state["i"]
        state["i"] = (i + 1) % len(calls)
        return calls[i]()
    return step


def parse_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]
