"""vLLM CPU's own linear path, timed per GEMM: `_C.create_onednn_mm_handler` prepacks the
weight once (as `dispatch_cpu_unquantized_gemm` does for every dense layer on a CPU
without AMX) and `_C.onednn_mm` runs it. Runs under vLLM's interpreter
(`$ANDANTE_PEERS/vllm-venv/bin/python`), called by benchmarks/gemm_paths.py --vllm.
Prints ONE JSON line: {"rows": [{shape, m, threads, path: "vllm_onednn", wall_us, ...}]}.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemm_timing import (  # noqa: E402
    SHAPES,
    copies_for,
    cycling,
    parse_ints,
    reps_for,
    time_call,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=parse_ints, default=[1, 8, 16, 256])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default=",".join(name for name, _, _ in SHAPES))
    ap.add_argument("--cold", action="store_true", help="cycle through weight copies")
    args = ap.parse_args()
    from vllm import _custom_ops as ops  # the peer's interpreter only

    torch.set_num_threads(args.threads)
    rows = []
    for name, k, n in SHAPES:
        if name not in args.shapes.split(","):
            continue
        handlers = [ops.create_onednn_mm((torch.randn(n, k) * k ** -0.5).bfloat16().t(), 32)
                    for _ in range(copies_for(n * k * 2, args.cold))]
        for m in args.rows:
            x = torch.randn(m, k).bfloat16()
            fn = cycling([partial(ops.onednn_mm, h, x, None) for h in handlers])
            rows.append({"shape": name, "m": m, "threads": args.threads,
                         "path": "vllm_onednn", "copies": len(handlers),
                         **time_call(fn, reps_for(m, k, n), args.rounds)})
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
