"""The real engine's prefill step alone: wall and CPU milliseconds per step, by prompt
shape, attention path and thread count, and optionally a torch.profiler table of one step.

The prefill counterpart of benchmarks/decode_step.py. One bf16 TorchExecutor per
prefill attention path of `--paths` (the embedded SmolLM2 unless `--model`; "sdpa":
PyTorch's fused kernel, "matmul": andante.exec.torch_attention.prefill_attention_matmul),
no thread adaptation, step buckets as served. Each shape NxC of `--shapes` (N fresh
prompts of C tokens, one step, every prompt sampled) runs through the executor's own
forward pass and sampler at each thread count of `--threads`; the configurations are
interleaved over `--rounds` rounds of `--steps` steps each. Per configuration: the median
wall ms per step, the median process CPU ms per step (all threads) and the stepping
thread's own CPU ms. The 1-minute load average before and after. Prints ONE JSON line.
`--profile-dir D` also writes D/{path}_{N}x{C}_t{T}.txt, the operator table of `--steps`
steps. Run it under `nice -n 10` on a shared machine.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from decode_step import profile_step, timed_steps  # noqa: E402


def parse_shape(text: str) -> tuple[int, int]:
    """"NxC" -> (N prompts, C tokens each)."""
    try:
        n, c = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a shape is NxC (e.g. 1x256), got {text!r}") from exc
    if n < 1 or c < 2:
        raise argparse.ArgumentTypeError(f"a shape needs N >= 1 and C >= 2, got {text!r}")
    return n, c


def prefill_batch(num_prompts: int, length: int, block_size: int) -> Any:
    """One step of `num_prompts` fresh prompts of `length` tokens, each in its own blocks."""
    from andante.core import Request, SamplingParams
    from andante.exec.batch import StepBatch

    params = SamplingParams(max_tokens=1, temperature=0.0)
    per_prompt = -(-length // block_size)
    batch = StepBatch()
    for i in range(num_prompts):
        prompt = [(100 + 7 * i + t) % 30000 for t in range(length)]
        table = list(range(i * per_prompt, (i + 1) * per_prompt))
        batch.add(Request(f"prefill-{i}", prompt, params, 0.0), length, 0, True, table)
    return batch


def build_executor(args: argparse.Namespace, path: str) -> Any:
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models import load_model

    tokens = max(n * c for n, c in args.shapes)
    model = load_model(args.model, "bfloat16")
    form = {} if args.layer_form is None else {"layer_form": args.layer_form}
    return TorchExecutor(model, TorchExecutorOptions(
        num_threads=max(args.threads), kv_cache_gib=0.5, swap_space_gib=0.0,
        parallel_min_tokens=None, adapt_threads=False, warmup_tokens=tokens,
        warmup_seqs=max(n for n, _ in args.shapes), prefill_attention=path, **form))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=[(1, 256)])
    p.add_argument("--paths", nargs="+", default=["sdpa", "matmul"],
                   choices=("auto", "sdpa", "matmul"))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layer-form", default=None, choices=("auto", "epilogue", "plain"),
                   help="the fused layers' form (default: the executor's)")
    p.add_argument("--profile-dir", type=Path, default=None)
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    executors = {path: build_executor(args, path) for path in args.paths}
    startup_s = time.perf_counter() - started
    block_size = next(iter(executors.values())).options.block_size
    batches = {f"{n}x{c}": prefill_batch(n, c, block_size) for n, c in args.shapes}
    samples: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for shape, batch in batches.items():
            for path, executor in executors.items():
                for threads in args.threads:
                    samples.setdefault(f"{path}_{shape}_t{threads}", []).append(
                        timed_steps(executor, batch, threads, args.steps))
    figures = {key: {name: round(statistics.median(r[name] for r in runs) * 1e3, 2)
                     for name in ("wall", "cpu", "own")} for key, runs in samples.items()}
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        for shape, batch in batches.items():
            for path, executor in executors.items():
                for threads in args.threads:
                    profile_step(executor, batch, threads, args.steps,
                                 args.profile_dir / f"{path}_{shape}_t{threads}.txt")
    print(json.dumps({
        "ms_per_step": figures,
        "prefill_matmul": {path: ex.inputs.prefill_matmul for path, ex in executors.items()},
        "prefill_path_us": {path: ex.prefill_path_us for path, ex in executors.items()},
        "epilogues": {path: ex.epilogues for path, ex in executors.items()},
        "startup_s": round(startup_s, 1), "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
