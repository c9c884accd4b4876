"""Per-GEMM wall and CPU microseconds of SmolLM2's projections by each linear path
PyTorch offers andante on this CPU, next to vLLM CPU's own oneDNN matmul.

Paths (rows M of `--rows`, threads of `--threads`, `--rounds` rounds per measurement):
- "linear_bf16": `F.linear` on bf16 tensors (oneDNN through ATen, the weight in plain
  layout each call);
- "packed_bf16": the weight prepacked once by `torch.ops.mkldnn._reorder_linear_weight`,
  called by `torch.ops.mkldnn._linear_pointwise` (what andante's fused layers run);
- "packed_bf16_m": the same, the weight packed for this M (`batch_size` hint);
- "linear_f32": `F.linear` in float32 (MKL's sgemm);
- "mkl_f32": float32 through `torch.ops.mkl._mkl_linear` with an MKL-packed weight;
- "vllm_onednn" (with `--vllm`): vLLM's `_C.onednn_mm` with its prepacked handler, timed by
  benchmarks/vllm_peer/onednn_gemm.py under vLLM's interpreter (a subprocess; andante never
  imports vLLM).
`--cold` cycles through copies of each weight past the L3 cache, so every call streams
its weight from memory as a decode step's layers do (the default times a warm weight).
Prints ONE JSON line: {"load": [...], "rows": [{shape, m, threads, path, wall_us, ...}]}.
Run it under `nice -n 10` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gemm_timing import (  # noqa: E402
    SHAPES,
    copies_for,
    cycling,
    parse_ints,
    reps_for,
    time_call,
)
from peer_paths import VLLM_PYTHON  # noqa: E402

PATHS = ("linear_bf16", "packed_bf16", "packed_bf16_m", "linear_f32", "mkl_f32")


def path_call(path: str, x: torch.Tensor, w: torch.Tensor, m: int) -> Any:
    mkldnn = torch.ops.mkldnn
    if path == "linear_bf16":
        xb, wb = x.bfloat16(), w.bfloat16()
        return lambda: F.linear(xb, wb)
    if path in ("packed_bf16", "packed_bf16_m"):
        xb = x.bfloat16()
        packed = mkldnn._reorder_linear_weight(w.bfloat16(), m if path.endswith("_m") else None)
        return lambda: mkldnn._linear_pointwise(xb, packed, None, "none", [], "")
    if path == "linear_f32":
        return lambda: F.linear(x, w)
    if path == "mkl_f32":
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        return lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, m)
    raise ValueError(path)


def andante_rows(ms: list[int], threads: list[int], rounds: int, paths: list[str],
                 cold: bool, shapes: list[str]) -> list[dict[str, Any]]:
    out = []
    for t in threads:
        torch.set_num_threads(t)
        for name, k, n in SHAPES:
            if name not in shapes:
                continue
            weights = [torch.randn(n, k) * k ** -0.5
                       for _ in range(copies_for(n * k * 2, cold))]
            for m in ms:
                x = torch.randn(m, k)
                for path in paths:
                    try:
                        fn = cycling([path_call(path, x, w, m) for w in weights])
                    except (RuntimeError, AttributeError) as exc:
                        out.append({"shape": name, "m": m, "threads": t, "path": path,
                                    "error": str(exc)[:120]})
                        continue
                    out.append({"shape": name, "m": m, "threads": t, "path": path,
                                "copies": len(weights),
                                **time_call(fn, reps_for(m, k, n), rounds)})
    return out


def vllm_rows(python: Path, ms: list[int], threads: list[int], rounds: int, cold: bool,
              shapes: list[str]) -> list[dict[str, Any]]:
    out = []
    for t in threads:
        env = {**os.environ, "OMP_NUM_THREADS": str(t)}
        cmd = [str(python), str(HERE / "vllm_peer" / "onednn_gemm.py"),
               "--shapes", ",".join(shapes),
               "--rows", ",".join(map(str, ms)), "--threads", str(t), "--rounds", str(rounds),
               *(["--cold"] if cold else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900,
                              check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"vLLM's GEMM timing failed: {proc.stderr[-2000:]}")
        out.extend(json.loads(lines[-1])["rows"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(name for name, _, _ in SHAPES),
                    help="which of SmolLM2's projections (default all)")
    ap.add_argument("--rows", type=parse_ints, default=[1, 8, 16, 256])
    ap.add_argument("--threads", type=parse_ints, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--vllm", action="store_true", help="also time vLLM CPU's onednn_mm")
    ap.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    ap.add_argument("--cold", action="store_true",
                    help="cycle through weight copies past the L3 (decode's regime)")
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    unknown = ((set(shapes) - {name for name, _, _ in SHAPES})
               | (set(args.paths.split(",")) - set(PATHS)))
    if unknown:
        ap.error(f"unknown shape or path: {sorted(unknown)}")
    load = [os.getloadavg()[0]]
    rows = andante_rows(args.rows, args.threads, args.rounds, args.paths.split(","),
                        args.cold, shapes)
    if args.vllm:
        rows += vllm_rows(args.vllm_python, args.rows, args.threads, args.rounds, args.cold,
                          shapes)
    load.append(os.getloadavg()[0])
    print(json.dumps({"torch": torch.__version__, "load": load, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
