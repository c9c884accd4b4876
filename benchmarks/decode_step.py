"""The real engine's decode step alone: wall and CPU milliseconds per step, by batch and
thread count, and optionally a torch.profiler table of one step.

One bf16 TorchExecutor (the embedded SmolLM2 unless `--model`), no thread adaptation:
each batch size B of `--batches` runs synthetic decode steps at context `--context`
(andante.exec.torch_threads.probe_batch, the start-up probe's steps) through the
executor's own forward pass and sampler, at each thread count of `--threads`, the
configurations interleaved over `--rounds` rounds of `--steps` steps each. Per
configuration: the median wall ms per step, the median process CPU ms per step (all
threads; moves less than wall time with outside load) and the stepping thread's own CPU
ms (its serial share: Python, dispatch, small kernels). `--attention-threads 0 1` also
compares decode attention on the step's threads (0) and on one (1, andante.exec.
thread_scope); by default it runs as the executor chose at start-up. The 1-minute load
average before and after. Prints ONE JSON line. `--profile-dir D` also writes D/b{B}_t{N}.txt, the
operator table of `--steps` steps. Run it under `nice -n 10` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build_executor(args: argparse.Namespace) -> Any:
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models import load_model

    model = load_model(args.model, "bfloat16")
    form = {} if args.layer_form is None else {"layer_form": args.layer_form}
    return TorchExecutor(model, TorchExecutorOptions(
        num_threads=max(args.threads), kv_cache_gib=0.5, swap_space_gib=0.0,
        parallel_min_tokens=None, adapt_threads=False, warmup_tokens=max(args.batches),
        warmup_seqs=max(args.batches), decode_attention=args.decode_attention, **form))


def timed_steps(executor: Any, batch: Any, threads: int, steps: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    executor._forward(batch)  # a warm-up at this thread count
    wall, cpu, own = [], [], []
    for _ in range(steps):
        w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
        executor._forward(batch)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        own.append(time.thread_time() - t0)
    return {"wall": statistics.median(wall), "cpu": statistics.median(cpu),
            "own": statistics.median(own)}


def profile_step(executor: Any, batch: Any, threads: int, steps: int, path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    executor._forward(batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            executor._forward(batch)
    path.write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


def main(argv: list[str] | None = None) -> int:
    from andante.exec.torch_threads import probe_batch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--decode-attention", default="auto",
                   choices=("auto", "sdpa", "matmul", "matmul_native"))
    p.add_argument("--layer-form", default=None, choices=("auto", "epilogue", "plain"),
                   help="the fused layers' form (default: the executor's)")
    p.add_argument("--attention-threads", type=int, nargs="+", default=None, choices=(0, 1),
                   help="decode attention on the step's threads (0) or on one (1), compared "
                        "(default: the executor's start-up choice)")
    p.add_argument("--profile-dir", type=Path, default=None)
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    executor = build_executor(args)
    startup_s = time.perf_counter() - started
    block_size = executor.options.block_size
    batches = {b: probe_batch(b, block_size, args.context) for b in args.batches}
    samples: dict[str, list[dict[str, float]]] = {}
    chosen = executor.inputs.decode_one_thread_below
    below = {0: 0, 1: 1 << 30}  # decode attention on all threads / on one (thread_scope)
    attention_threads = args.attention_threads or [None]
    for _ in range(args.rounds):
        for b, batch in batches.items():
            for threads in args.threads:
                for at in attention_threads:
                    executor.inputs.decode_one_thread_below = chosen if at is None else below[at]
                    key = f"b{b}_t{threads}" + ("" if at is None else f"_a{at}")
                    samples.setdefault(key, []).append(
                        timed_steps(executor, batch, threads, args.steps))
    figures = {key: {name: round(statistics.median(r[name] for r in runs) * 1e3, 2)
                     for name in ("wall", "cpu", "own")} for key, runs in samples.items()}
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        for b, batch in batches.items():
            for threads in args.threads:
                profile_step(executor, batch, threads, args.steps,
                             args.profile_dir / f"b{b}_t{threads}.txt")
    print(json.dumps({"ms_per_step": figures, "context": args.context,
                      "decode_matmul": executor.inputs.decode_matmul,
                      "epilogues": getattr(executor, "epilogues", True),
                      "layer_form_us": getattr(executor, "layer_form_us", {}),
                      "decode_one_thread_below": chosen,
                      "decode_threads_us": {str(b): v for b, v in
                                            executor.decode_threads_us.items()},
                      "startup_s": round(startup_s, 1),
                      "load_before": round(load_before, 2),
                      "load_after": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
