"""Simulator fidelity: one Poisson workload on the real engine and in the simulator.

The real run replays the workload live: requests (random prompt ids of the workload's
lengths, greedy, exactly `output_len` tokens) are submitted when the wall clock reaches
their arrival times, and the real scheduler (`--policy`, default vllm) drives the
TorchExecutor on the embedded SmolLM2-135M. The simulated run feeds the same workload
to `andante.sim.simulate` with `--model smollm2-135m --hardware cpu`, i.e. the profile
`andante calibrate` saved (with `--calibrate`, the sweep runs first, on the same machine
state). Prints one JSON line: median TTFT and TPOT on both sides and their relative
errors |sim - real| / real (target <= 10%).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from andante.core import MonotonicClock, Request, SamplingParams
from andante.metrics.record import records_from_requests
from andante.metrics.summary import Summary, summarize
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec, WorkloadConfig, build_workload


def real_run(args: argparse.Namespace, workload: list[RequestSpec],
             config: SchedulerConfig) -> Summary:
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.llm import build_offline_engine, run_timed
    from andante.models import load_model

    model = load_model(None, "bfloat16")
    executor = TorchExecutor(model, TorchExecutorOptions(num_threads=args.threads,
                                                         kv_cache_gib=args.kv_cache_gib))
    engine = build_offline_engine(model, args.policy, config, executor,
                                  clock=MonotonicClock())
    warm = [Request(f"warm{i}", [1000 + i] * 64, SamplingParams(max_tokens=4, temperature=0,
                                                                ignore_eos=True), 0.0)
            for i in range(2)]
    for req in warm:
        engine.add_request(req)
    while engine.has_work:
        engine.step()
    rng = np.random.default_rng(args.seed)
    start = engine.clock.now() + 0.5
    requests = [
        Request(f"r{i}", rng.integers(1000, 40000, spec.prompt_len).tolist(),
                SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True),
                start + spec.arrival_time)
        for i, spec in enumerate(workload)
    ]
    run_timed(engine, requests)
    return summarize(records_from_requests(requests))


def sim_run(args: argparse.Namespace, workload: list[RequestSpec],
            config: SchedulerConfig) -> Summary:
    spec = ClusterSpec(model="smollm2-135m", hardware=args.hardware, policy=args.policy,
                       scheduler=config)
    return simulate(spec, workload).summary


def _figures(summary: Summary) -> dict[str, float]:
    return {"ttft_median_ms": round(summary.ttft.median * 1e3, 2),
            "tpot_median_ms": round(summary.tpot.median * 1e3, 2),
            "ttft_mean_ms": round(summary.ttft.mean * 1e3, 2),
            "tpot_mean_ms": round(summary.tpot.mean * 1e3, 2),
            "num_finished": summary.num_finished}


def _calibrate(args: argparse.Namespace) -> dict[str, Any]:
    from andante.exec.torch_calibrate import calibrate
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models import load_model
    from andante.perf.catalog import save_hardware

    model = load_model(None, "bfloat16")
    executor = TorchExecutor(model, TorchExecutorOptions(num_threads=args.threads,
                                                         kv_cache_gib=args.kv_cache_gib))
    result = calibrate(executor, name=args.hardware)
    save_hardware(result.hardware)
    return {"fit_error": round(result.error, 4), "num_samples": len(result.samples)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=0.5, help="requests/s (Poisson)")
    p.add_argument("--num-requests", type=int, default=30)
    p.add_argument("--lengths", default="uniform:32:256:16:96")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="vllm")
    p.add_argument("--hardware", default="cpu", help="saved profile the simulator uses")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--calibrate", action="store_true", help="calibrate (and save) first")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    workload = build_workload(WorkloadConfig(kind="poisson", rate=args.rate,
                                             num_requests=args.num_requests,
                                             lengths=args.lengths, seed=args.seed))
    config = SchedulerConfig(max_model_len=2048, max_num_batched_tokens=8192)
    calibration = _calibrate(args) if args.calibrate else None
    started = time.perf_counter()
    real = _figures(real_run(args, workload, config))
    sim = _figures(sim_run(args, workload, config))
    errors = {f"{m}_error": round(abs(sim[f"{m}_median_ms"] - real[f"{m}_median_ms"])
                                  / real[f"{m}_median_ms"], 4) for m in ("ttft", "tpot")}
    print(json.dumps({"benchmark": "fidelity", "workload": {
        "kind": "poisson", "rate": args.rate, "num_requests": args.num_requests,
        "lengths": args.lengths, "seed": args.seed}, "policy": args.policy,
        "calibration": calibration, "real": real, "sim": sim, **errors, "target": 0.10,
        "wall_s": round(time.perf_counter() - started, 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
