"""OpenMP wait policies for the real engine, quiet and beside a CPU-bound neighbour.

libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when torch loads it, so the engine
cannot switch them while running; andante chooses them before torch is imported
(andante.exec.omp_wait). This measures that choice: benchmarks/decode_step.py (decode
steps at `--batches`, `--threads` threads) in a fresh process per policy, each policy
quiet and then with one busy-looping neighbour process started beside it
(benchmarks/neighbours.py), the policies interleaved over `--rounds` rounds. Policies:
`default` (libgomp's: spin 300,000 iterations, ~0.1-0.3 ms, before sleeping), `passive`
(sleep at once), and `spin:N` (GOMP_SPINCOUNT=N). Medians of wall ms per step; the
1-minute load average before and after. Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from neighbours import Neighbours  # noqa: E402

POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_env(policy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in POLICY_VARS}
    env["ANDANTE_OMP_WAIT"] = "keep"  # measure exactly this policy
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy.startswith("spin:"):
        env["GOMP_SPINCOUNT"] = policy.split(":", 1)[1]
    elif policy != "default":
        raise ValueError(f"unknown policy {policy!r}")
    return env


def decode_run(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "decode_step.py"), "--threads", str(args.threads),
           "--batches", *map(str, args.batches), "--steps", str(args.steps),
           "--rounds", "1"]
    if args.model:
        cmd += ["--model", args.model]
    out = subprocess.run(cmd, env=policy_env(policy), check=True, capture_output=True,
                         text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", nargs="+", default=["default", "passive", "spin:10000"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--model", default=None)
    p.add_argument("--where", nargs="+", choices=("quiet", "neighbour"),
                   default=["quiet", "neighbour"],
                   help="as the machine is, and/or with one busy-looping process added")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    walls: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for policy in args.policies:
            for where in args.where:
                starts = [0.0] if where == "neighbour" else []
                figures, _ = Neighbours(starts).around(lambda p=policy: decode_run(p, args))
                for key, ms in figures.items():
                    walls.setdefault(f"{policy}/{where}", {}).setdefault(key, []).append(
                        ms["wall"])
    medians = {run: {key: round(statistics.median(v), 2) for key, v in per.items()}
               for run, per in walls.items()}
    print(json.dumps({"wall_ms_per_step": medians, "threads": args.threads,
                      "load_before": round(load_before, 2),
                      "load_after": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
