"""Where a 2-thread step's CPU time goes: the stepping thread vs the OpenMP worker.

The 16-concurrent figure of engine_vs_peers.py (16 requests of 128 prompt + 64 output
tokens, greedy) runs on `--threads` threads with every step on all of them and prefix
caching off. With OMP_WAIT_POLICY=PASSIVE (set here) a worker sleeps between parallel
regions, so the process's CPU time less the stepping thread's is the work the workers
did: an op that never reaches a worker shows up as stepping-thread time alone. Unlike
wall time, these CPU times move little when other processes load the machine, so two
checkouts can be compared on a busy machine (run this script in each, interleaved).
Reports medians over `--rounds` (after one warm-up round) of the prefill step's and
of one decode step's CPU ms on each side. Prints ONE JSON line.
"""

from __future__ import annotations

import os

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts OpenMP

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from andante_half import _Prompts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--output", type=int, default=64)
    args = p.parse_args(argv)
    if min(args.threads, args.rounds, args.requests, args.prompt) < 1 or args.output < 2:
        p.error("--threads, --rounds, --requests, --prompt must be >= 1, --output >= 2")
    from andante.core import Request, SamplingParams
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.llm import build_offline_engine, run_to_completion
    from andante.models import load_model
    from andante.policies import SchedulerConfig

    model = load_model(None, "bfloat16")
    executor = TorchExecutor(model, TorchExecutorOptions(
        num_threads=args.threads, kv_cache_gib=2.0, swap_space_gib=0.0,
        parallel_min_tokens=None))
    engine = build_offline_engine(model, "vllm", SchedulerConfig(
        max_model_len=2048, max_num_batched_tokens=8192, enable_prefix_caching=False),
        executor)
    prompts, params = _Prompts(), SamplingParams(max_tokens=args.output, temperature=0.0,
                                                 ignore_eos=True)
    rows = []
    for r in range(args.rounds + 1):
        for i, prompt in enumerate(prompts("concurrent", args.requests, args.prompt)):
            engine.add_request(Request(f"split-{r}-{i}", prompt, params, 0.0))
        p0, t0 = time.process_time(), time.thread_time()
        engine.step()
        p1, t1 = time.process_time(), time.thread_time()
        run_to_completion(engine)
        p2, t2 = time.process_time(), time.thread_time()
        steps = args.output - 1
        if r:
            rows.append({"prefill_stepping_ms": (t1 - t0) * 1e3,
                         "prefill_worker_ms": (p1 - p0 - (t1 - t0)) * 1e3,
                         "decode_stepping_ms": (t2 - t1) / steps * 1e3,
                         "decode_worker_ms": (p2 - p1 - (t2 - t1)) / steps * 1e3})
    result = {"benchmark": "engine_thread_split", "threads": args.threads,
              "rounds": args.rounds, "loadavg_1m": round(os.getloadavg()[0], 2),
              **{k: round(statistics.median(row[k] for row in rows), 2) for k in rows[0]}}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
