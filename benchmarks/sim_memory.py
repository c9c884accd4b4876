"""Peak resident memory of a streamed simulation: N Poisson requests on one instance.

`simulate(..., keep_records=False)` (what `andante simulate` runs) makes each request when
it arrives and keeps only running aggregates once it finishes, so memory should not grow
with N beyond the workload itself (~0.3 KB per request spec). Target: 1,000,000 requests
in <= 1 GB resident (`--num-requests 1000000`). Prints one JSON line; `--keep-records`
measures the in-memory path instead.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from andante.sim import ClusterSpec, simulate
from andante.workload import WorkloadConfig, build_workload


def _rss_mb(path: Path = Path("/proc/self/status")) -> float:
    """Current resident set (VmRSS), in MiB."""
    for line in path.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=1.5)
    parser.add_argument("--lengths", default="sharegpt")
    parser.add_argument("--policy", default="vllm")
    parser.add_argument("--keep-records", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    before = _rss_mb()
    workload = build_workload(WorkloadConfig(
        kind="poisson", rate=args.rate, num_requests=args.num_requests,
        lengths=args.lengths, max_context=8192, seed=args.seed,
    ))
    with_workload = _rss_mb()
    started = time.perf_counter()
    run = simulate(ClusterSpec(policy=args.policy), workload, keep_records=args.keep_records)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({
        "benchmark": "sim_memory", "num_requests": len(workload), "policy": args.policy,
        "keep_records": args.keep_records, "lengths": args.lengths, "rate": args.rate,
        "completed": run.summary.num_finished, "rss_start_mb": round(before, 1),
        "rss_with_workload_mb": round(with_workload, 1), "peak_rss_mb": round(peak, 1),
        "wall_s": round(wall, 1), "requests_per_wall_s": round(len(workload) / wall, 1),
    }))


if __name__ == "__main__":
    main()
