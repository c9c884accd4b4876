"""Simulated requests per wall-second: N Poisson requests on one simulated instance,
under every registered policy (or those of `--policies`), on each workload of
`--workloads`, in one run.

Workloads (all with prefix caching on, the default): `sharegpt` (ShareGPT lengths at 1.5
req/s, the original figure); `long` (arXiv-like long prompts: 4k-12k prompt tokens,
100-400 output tokens, at 0.5 req/s, 16k context); `conversation` (ShareGPT lengths as
the turns of 64 conversations: each prompt repeats its conversation so far, so prefix
caching hashes and hits long prompts); `pressure` (ShareGPT lengths at 1.5 req/s on a KV
cache of 2,500 blocks, 40k tokens: memory pressure, preemptions, a queue).

Runs the real scheduler over `SimExecutor`, each policy on the same workload, and prints
ONE JSON line: per policy the simulated requests per wall-second of the simulation loop
(`requests_per_wall_s`, the figure compared with Vidur; target >= 2,000 for every
policy) and per CPU-second (`requests_per_cpu_s`, steadier on a shared machine), the
scheduler's steps, and the load average around its run. With `--rounds N` the policies
run in N interleaved rounds (a, b, c, a, b, c, ...) and each figure is the median of its
rounds (`rounds` keeps every round's rates and load averages), so that a busy machine
moves every policy alike. Peer: Vidur (benchmarks/vidur_peer/README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from andante.cli.simulate import token_budget
from andante.engine.config import SchedulerConfig
from andante.policies import policy_names
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec, WorkloadConfig, build_workload

TARGET = 2000.0


@dataclass(frozen=True, slots=True)
class Workload:
    config: WorkloadConfig
    max_model_len: int = 8192
    num_kv_blocks: int | None = None


def workloads(args: argparse.Namespace) -> dict[str, Workload]:
    n, seed = args.num_requests, args.seed
    sharegpt = WorkloadConfig(kind="poisson", rate=args.rate, num_requests=n,
                              lengths=args.lengths, max_context=8192, seed=seed)
    return {
        "sharegpt": Workload(sharegpt),
        "long": Workload(WorkloadConfig(kind="poisson", rate=0.5, num_requests=n,
                                        lengths="uniform:4000:12000:100:400",
                                        max_context=16384, seed=seed), max_model_len=16384),
        "conversation": Workload(dataclasses.replace(
            sharegpt, prefix_sharing="conversation:64")),
        "pressure": Workload(sharegpt, num_kv_blocks=2500),
    }


def measure(args: argparse.Namespace, policy: str, workload: list[RequestSpec],
            setup: Workload) -> dict[str, Any]:
    spec = ClusterSpec(model=args.model, hardware=args.hardware, policy=policy,
                       num_kv_blocks=setup.num_kv_blocks,
                       scheduler=SchedulerConfig(
                           max_model_len=setup.max_model_len,
                           max_num_batched_tokens=token_budget([policy], 8192,
                                                               setup.max_model_len)))
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


_RATES = ("requests_per_wall_s", "requests_per_wall_s_with_metrics", "requests_per_cpu_s")


def median_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The last round's figures with each rate replaced by its median over `rounds`, and
    every round's rates and load averages under `rounds`."""
    merged = dict(rounds[-1])
    for key in _RATES:
        merged[key] = round(statistics.median(r[key] for r in rounds), 1)
    merged["rounds"] = [{key: r[key] for key in (*_RATES, "loadavg_1m")} for r in rounds]
    return merged


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
    parser.add_argument("--rounds", type=int, default=1,
                        help="interleaved rounds of every policy; figures are medians")
    parser.add_argument("--workloads", default="sharegpt,long,conversation,pressure",
                        help="comma-separated: sharegpt, long, conversation, pressure")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    every = workloads(args)
    names = args.workloads.split(",")
    unknown = sorted(set(names) - set(every))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {sorted(every)}")
    built = {name: build_workload(every[name].config) for name in names}
    policies = policy_names() if args.policies == "all" else args.policies.split(",")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {
        (w, p): [] for w in names for p in policies}
    for _ in range(args.rounds):
        for name in names:
            for policy in policies:
                runs[name, policy].append(measure(args, policy, built[name], every[name]))
    results = {name: {policy: median_of_rounds(runs[name, policy]) for policy in policies}
               for name in names}
    slowest = {name: min(r, key=lambda p: r[p]["requests_per_wall_s"])
               for name, r in results.items()}
    print(json.dumps({
        "benchmark": "sim_speed", "num_requests": args.num_requests, "rate": args.rate,
        "lengths": args.lengths, "model": args.model, "hardware": args.hardware,
        "rounds": args.rounds, "target_requests_per_wall_s": TARGET, "slowest": slowest,
        "workloads": names, "results": results,
    }))


if __name__ == "__main__":
    main()
