"""Step-size buckets on the real engine, side by side in one process (paired, interleaved).

One bf16 TorchExecutor with buckets warmed up to `--warmup-tokens`; its `unbucketed()`
mode runs steps at their exact row counts, so each prompt length L (drawn from
`--min-len`..`--max-len`, never a bucket, never repeated: a size the process has not
run, as a server meets most prompt lengths) runs three ways, the order alternating:

* `bucketed`: padded to its bucket, warmed at start-up (what serving now does);
* `exact_cold`: at L rows, the first time (what serving did: oneDNN builds that size);
* `exact_warm`: at L rows again (the floor: no setup, no padding).

Then `--repeats` interleaved pairs of a `--fixed-len` prefill (256, itself a bucket),
bucketed and exact, both warm: what the bucketed path costs where it pads nothing.
Wall and process CPU ms per prefill (CPU time moves less with outside load), means over
the lengths, medians over the pairs; the 1-minute load average before and after.
Prints ONE JSON line. Wrap it in `flock /tmp/engine-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from andante.perf.paths import env_switch
from andante.perf.step_sizes import NO_BUCKETS_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _prefill(num_tokens: int, index: int) -> Any:
    from andante.core import Request, SamplingParams
    from andante.exec.batch import StepBatch

    batch = StepBatch()
    prompt = [(index * 7919 + i * 31) % 40000 + 100 for i in range(num_tokens)]
    batch.add(Request(f"p{index}", prompt, SamplingParams(max_tokens=1, temperature=0.0),
                      0.0), num_tokens, 0, True, list(range(-(-num_tokens // 16))))
    return batch


def _timed(executor: Any, batch: Any, exact: bool) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one step, bucketed or at its exact row count."""
    wall, cpu = time.perf_counter(), time.process_time()
    if exact:
        with executor.unbucketed():
            executor.execute(batch)
    else:
        executor.execute(batch)
    return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3


def _lengths(args: argparse.Namespace, buckets: Any) -> list[int]:
    pool = [n for n in range(args.min_len, args.max_len + 1) if buckets.pad(n) != n]
    return random.Random(args.seed).sample(pool, args.prompts)


def _mean(rows: list[tuple[float, float]], i: int) -> float:
    return round(statistics.mean(r[i] for r in rows), 2)


def mixed_sizes(executor: Any, args: argparse.Namespace) -> dict[str, Any]:
    lengths = _lengths(args, executor.runner.buckets)
    runs: dict[str, list[tuple[float, float]]] = {
        "bucketed": [], "exact_cold": [], "exact_warm": []}
    for k, n in enumerate(lengths):
        order = ["bucketed", "exact_cold"] if k % 2 == 0 else ["exact_cold", "bucketed"]
        for j, kind in enumerate([*order, "exact_warm"]):
            runs[kind].append(_timed(executor, _prefill(n, 3 * k + j), kind != "bucketed"))
    pad = [executor.runner.buckets.pad(n) - n for n in lengths]
    return {"prompts": len(lengths), "range": [args.min_len, args.max_len],
            "mean_pad_rows": round(statistics.mean(pad), 1),
            **{f"{kind}_wall_ms": _mean(rows, 0) for kind, rows in runs.items()},
            **{f"{kind}_cpu_ms": _mean(rows, 1) for kind, rows in runs.items()}}


def fixed_size(executor: Any, args: argparse.Namespace) -> dict[str, Any]:
    n = args.fixed_len
    for unpadded in (False, True):  # both warm
        _timed(executor, _prefill(n, -1), unpadded)
    pairs = []
    for k in range(args.repeats):
        first = k % 2 == 0
        a = _timed(executor, _prefill(n, 10_000 + 2 * k), not first)
        b = _timed(executor, _prefill(n, 10_001 + 2 * k), first)
        pairs.append((a, b) if first else (b, a))  # (bucketed, exact)
    out: dict[str, Any] = {"tokens": n, "pairs": len(pairs)}
    for i, unit in ((0, "wall"), (1, "cpu")):
        bucketed = statistics.median(p[0][i] for p in pairs)
        exact = statistics.median(p[1][i] for p in pairs)
        out[f"bucketed_{unit}_ms"] = round(bucketed, 2)
        out[f"exact_{unit}_ms"] = round(exact, 2)
        out[f"bucketed_over_exact_{unit}"] = round(bucketed / exact, 3)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the embedded GGUF")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--min-len", type=int, default=32)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--fixed-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.min_len <= args.max_len or args.prompts < 1 or args.repeats < 1:
        p.error("need 1 <= --min-len <= --max-len, --prompts >= 1 and --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models import load_model

    if env_switch(NO_BUCKETS_ENV):
        print("step_buckets.py: unset ANDANTE_NO_STEP_BUCKETS", file=sys.stderr)
        return 2
    model = load_model(args.model, "bfloat16")
    executor = TorchExecutor(model, TorchExecutorOptions(
        num_threads=args.threads, kv_cache_gib=1.0, swap_space_gib=0.0,
        warmup_tokens=args.warmup_tokens))
    if executor.runner.buckets is None:
        print("step_buckets.py: this CPU runs no fused bf16 path", file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    result = {"benchmark": "step_buckets", "threads": args.threads,
              "warmup_s": round(executor.warmup.seconds, 2),
              "warmup_sizes": len(executor.warmup.sizes),
              "mixed": mixed_sizes(executor, args), "fixed": fixed_size(executor, args),
              "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
