"""Simulated requests per wall-second: N Poisson requests on one simulated instance,
under every registered policy (or those of `--policies`), in one run.

Runs the real scheduler over `SimExecutor`, each policy on the same workload, and prints
ONE JSON line: per policy the simulated requests per wall-second of the simulation loop
(`requests_per_wall_s`, the figure compared with Vidur; target >= 2,000 for every
policy) and per CPU-second (`requests_per_cpu_s`, steadier on a shared machine), the
scheduler's steps, and the load average around its run. Peer: Vidur
(benchmarks/vidur_peer/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from andante.policies import policy_names
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec, WorkloadConfig, build_workload

TARGET = 2000.0


def measure(args: argparse.Namespace, policy: str, workload: list[RequestSpec]) -> dict[str, Any]:
    spec = ClusterSpec(model=args.model, hardware=args.hardware, policy=policy)
    load = os.getloadavg()[0]
    started, cpu_started = time.perf_counter(), time.process_time()
    run = simulate(spec, workload, keep_records=False)
    total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    n = len(workload)
    return {
        "requests_per_wall_s": round(n / run.wall_seconds, 1),
        "requests_per_wall_s_with_metrics": round(n / total, 1),
        "requests_per_cpu_s": round(n / cpu, 1),
        "completed": run.summary.num_finished,
        "simulated_seconds": round(run.report.end_time, 1),
        "num_steps": sum(s.num_steps for s in run.report.instance_stats),
        "sim_wall_s": round(run.wall_seconds, 3),
        "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1.5)
    parser.add_argument("--lengths", default="sharegpt")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="a100-80g")
    parser.add_argument("--policies", default="all",
                        help="comma-separated, or all (every registered policy)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workload = build_workload(WorkloadConfig(
        kind="poisson", rate=args.rate, num_requests=args.num_requests,
        lengths=args.lengths, max_context=8192, seed=args.seed,
    ))
    policies = policy_names() if args.policies == "all" else args.policies.split(",")
    results = {policy: measure(args, policy, workload) for policy in policies}
    slowest = min(results, key=lambda p: results[p]["requests_per_wall_s"])
    print(json.dumps({
        "benchmark": "sim_speed", "num_requests": len(workload), "rate": args.rate,
        "lengths": args.lengths, "model": args.model, "hardware": args.hardware,
        "target_requests_per_wall_s": TARGET, "slowest": slowest, "results": results,
    }))


if __name__ == "__main__":
    main()
