"""Simulated requests per wall-second: N Poisson requests on one simulated instance.

Runs the real scheduler (the `vllm` policy by default) over `SimExecutor`. Prints one
JSON line. Peer: Vidur (see benchmarks/vidur_peer/README.md); target >= 10x its speed.
"""

from __future__ import annotations

import argparse
import json
import time

from andante.sim import ClusterSpec, simulate
from andante.workload import WorkloadConfig, build_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1.5)
    parser.add_argument("--lengths", default="sharegpt")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="a100-80g")
    parser.add_argument("--policy", default="vllm")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workload = build_workload(WorkloadConfig(
        kind="poisson", rate=args.rate, num_requests=args.num_requests,
        lengths=args.lengths, max_context=8192, seed=args.seed,
    ))
    spec = ClusterSpec(model=args.model, hardware=args.hardware, policy=args.policy)
    started, cpu_started = time.perf_counter(), time.process_time()
    run = simulate(spec, workload)
    total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    steps = sum(s.num_steps for s in run.report.instance_stats)
    print(json.dumps({
        "benchmark": "sim_speed", "num_requests": len(workload), "rate": args.rate,
        "lengths": args.lengths, "model": args.model, "hardware": args.hardware,
        "policy": args.policy, "simulated_seconds": round(run.report.end_time, 1),
        "num_steps": steps, "output_tokens": run.summary.total_output_tokens,
        "sim_wall_s": round(run.wall_seconds, 3), "total_wall_s": round(total, 3),
        "requests_per_wall_s": round(len(workload) / run.wall_seconds, 1),
        "requests_per_wall_s_with_metrics": round(len(workload) / total, 1),
        "requests_per_cpu_s_with_metrics": round(len(workload) / cpu, 1),
    }))


if __name__ == "__main__":
    main()
