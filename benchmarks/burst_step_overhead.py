"""Scheduling CPU time per engine step on serve_vs_vllm's burst workload, per policy.

    .venv/bin/python benchmarks/burst_step_overhead.py [--policy andes,vllm]
        [--hardware cpu] [--rate 2] [--duration 30] [--repeats 3]

Replays the burst workload of `serve_vs_vllm.py` (same WorkloadConfig: rate, duration,
lengths uniform:32:256:16:128, burst 2.5x for 30% of each duration/2 cycle, seed 1;
SLOs as the load generator sends them) step by step on one engine: a `SimExecutor` on a
manual clock gives each step the duration the hardware profile predicts (`--hardware`,
default the calibrated `cpu` profile if there is one), so the policies see the arrivals
and step boundaries the real server would, without its noise. It times, with the
process's CPU clock, what the real server does between forward passes on the engine's
thread: `scheduler.schedule()` (the policy's decision and its application) and
`scheduler.update()` (the policy's step-end hooks). Each policy runs `--repeats` times,
interleaved; the figures are medians over repeats.

Prints ONE JSON line: per policy, steps, median / mean / p90 / p99 µs per step, the
total seconds of scheduling, and the replay's TTFT p99 (ms, modeled step times only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from andante.core import ManualClock
from andante.engine.config import SchedulerConfig
from andante.exec.sim_executor import SimExecutor
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model, hardware_names
from andante.perf.cost_model import CostModel
from andante.policies import policy_names
from andante.workload import WorkloadConfig, build_workload
from andante.workload.spec import to_requests


def workload(rate: float, duration: float, seed: int) -> WorkloadConfig:
    """serve_vs_vllm.py's burst workload (its defaults)."""
    return WorkloadConfig(kind="burst", seed=seed, rate=rate, duration=duration,
                          num_requests=100_000, lengths="uniform:32:256:16:128",
                          burst_intensity=2.5, burst_share=0.3, cycle_length=duration / 2)


def replay(policy: str, cost: CostModel, cfg: WorkloadConfig) -> dict[str, Any]:
    """Step the engine through the workload; CPU seconds of scheduling per step."""
    clock = ManualClock()
    config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                             max_model_len=2048, enable_prefix_caching=False)
    engine = build_engine(SimExecutor(cost), clock, policy, config)
    requests = to_requests(build_workload(cfg))
    pending = requests[::-1]  # pop() takes the earliest
    samples: list[float] = []
    sched = engine.scheduler
    while pending or engine.has_work:
        if not engine.has_work:
            clock.advance_to(max(clock.now(), pending[-1].arrival_time))
        while pending and pending[-1].arrival_time <= clock.now():
            engine.add_request(pending.pop())
        started = time.process_time()
        batch = sched.schedule()
        spent = time.process_time() - started
        result = engine.executor.execute(batch)
        clock.advance_to(clock.now() + result.duration)
        started = time.process_time()
        engine.finish_step(batch, result)
        samples.append(spent + time.process_time() - started)
    ttfts = [r.timeline.token_times[0] - r.arrival_time for r in requests]
    return {"samples": samples, "ttft_p99_ms": float(np.percentile(ttfts, 99)) * 1e3}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def per_run(run: dict[str, Any]) -> dict[str, float]:
        us = np.array(run["samples"]) * 1e6
        return {"steps": len(us), "median_us": float(np.median(us)), "mean_us": float(us.mean()),
                "p90_us": float(np.percentile(us, 90)), "p99_us": float(np.percentile(us, 99)),
                "total_s": float(us.sum() / 1e6), "ttft_p99_ms": run["ttft_p99_ms"]}
    rows = [per_run(r) for r in runs]
    return {k: round(statistics.median(row[k] for row in rows), 2) for k in rows[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", default="andes,vllm", help="comma-separated policies")
    p.add_argument("--hardware", default=None,
                   help="hardware profile (default: the calibrated 'cpu' if saved, else a10-24g)")
    p.add_argument("--rate", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1,
                   help="serve_vs_vllm's burst seed (its --seed + 1)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    policies = [x for x in args.policy.split(",") if x]
    unknown = [x for x in policies if x not in policy_names()]
    if unknown or not policies or args.repeats < 1:
        print(f"burst_step_overhead.py: error: unknown policy {unknown} or --repeats < 1",
              file=sys.stderr)
        return 2
    hardware = args.hardware or ("cpu" if "cpu" in hardware_names() else "a10-24g")
    try:
        cost = CostModel(get_model("smollm2-135m"), get_hardware(hardware))
    except ValueError as exc:
        print(f"burst_step_overhead.py: error: {exc}", file=sys.stderr)
        return 2
    cfg = workload(args.rate, args.duration, args.seed)
    runs: dict[str, list[dict[str, Any]]] = {x: [] for x in policies}
    for _ in range(args.repeats):
        for policy in policies:
            runs[policy].append(replay(policy, cost, cfg))
    print(json.dumps({"hardware": hardware, "rate": args.rate, "duration": args.duration,
                      "repeats": args.repeats,
                      "policies": {x: summarize(r) for x, r in runs.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
