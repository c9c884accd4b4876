"""Scheduling policies on the real engine: `andante serve` variants under one workload.

    .venv/bin/python benchmarks/policies_on_engine.py \
        --system vllm="--policy vllm" --system andes="--policy andes" \
        --workload burst --rate 1.5 --duration 90 --num-kv-blocks 192

Each `--system NAME="SERVE ARGS"` is started in turn as `andante serve SERVE ARGS` (a
subprocess on a free port, embedded SmolLM2-135M on the CPU), warmed up, sent the same
workload by `andante bench`'s load generator (same seed: identical arrivals, lengths,
prompts and per-request SLOs; token-id prompts of exact length, `ignore_eos`,
streaming), and stopped. `--rounds N` alternates the systems N times (the machine is
shared: alternation spreads its noise over all of them) and reports per-round results
and their medians. SLOs: `--ttft-slo`/`--tbt-slo`/`--tds` fixed, or by default Andes'
(TTFT target max(prompt / 5000 tok/s, 1 s), reading speeds from Andes' distribution).
`--num-kv-blocks` is passed to every system: a small KV cache is what makes requests
queue for memory, the regime the policies differ in.

Prints ONE JSON line: per system the medians of mean QoE, TTFT p50/p99, TPOT mean,
output tokens/s, goodput and SLO attainment, plus each system's ratios to the first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from serve_vs_vllm import free_port, start, stop, warm_up  # same folder

from andante.bench.load import BenchConfig, run_bench
from andante.bench.prompts import PromptFormat
from andante.workload import WorkloadConfig, build_workload
from andante.workload.slo import SLOConfig

KEYS = ("num_finished", "mean_qoe", "qoe_attainment", "median_ttft_ms", "p99_ttft_ms",
        "mean_tpot_ms", "p99_tpot_ms", "output_throughput", "request_goodput",
        "slo_attainment", "mean_preemptions")
LOWER_IS_BETTER = ("median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms")


def parse_system(text: str) -> tuple[str, list[str]]:
    name, sep, serve_args = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME='SERVE ARGS', got {text!r}")
    return name, shlex.split(serve_args)


def serve_command(args: argparse.Namespace, serve_args: list[str], port: int) -> list[str]:
    cmd = [sys.executable, "-m", "andante.cli.main", "serve", "--port", str(port),
           "--max-queued", "100000", "--log-level", "warning",
           "--max-model-len", str(args.max_model_len)]
    if args.num_kv_blocks:
        cmd += ["--num-kv-blocks", str(args.num_kv_blocks)]
    return cmd + serve_args


def workload_config(args: argparse.Namespace) -> WorkloadConfig:
    return WorkloadConfig(
        kind=args.workload, rate=args.rate, duration=args.duration, num_requests=100_000,
        lengths=args.lengths, seed=args.seed, burst_intensity=args.burst_intensity,
        burst_share=args.burst_share, cycle_length=args.duration,
        slo=SLOConfig(ttft=args.ttft_slo, tbt=args.tbt_slo, tds=args.tds))


def bench_once(args: argparse.Namespace, name: str, serve_args: list[str],
               round_index: int) -> dict[str, Any]:
    port = free_port()
    log = args.log_dir / f"{name}-{round_index}.log"
    proc = start(serve_command(args, serve_args, port), port, log, args.start_timeout)
    try:
        warm_up(port)
        config = BenchConfig(base_url=f"http://127.0.0.1:{port}", seed=args.seed,
                             prompt_format=PromptFormat.parse("tokens"),
                             goodput=None)
        run = asyncio.run(run_bench(build_workload(workload_config(args)), config))
        out = run.to_dict()
        (args.log_dir / f"{name}-{round_index}.json").write_text(json.dumps(out))
        return {k: out.get(k) for k in KEYS} | {"num_errors": len(run.errors)}
    finally:
        stop(proc)


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in rows[0] if all(isinstance(r.get(k), (int, float)) for r in rows)]
    return {k: round(float(statistics.median(r[k] for r in rows)), 4) for k in keys}


def ratios(first: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """other vs first, > 1 where `other` is better."""
    out: dict[str, float | None] = {}
    for key in ("mean_qoe", "output_throughput", "request_goodput", *LOWER_IS_BETTER):
        a, b = first.get(key), other.get(key)
        if not a or not b:
            out[key] = None
        else:
            out[key] = round(a / b if key in LOWER_IS_BETTER else b / a, 3)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--system", type=parse_system, action="append", required=True,
                   help="NAME='andante serve arguments' (repeat; the first is the reference)")
    p.add_argument("--workload", default="burst", help="poisson, gamma or burst")
    p.add_argument("--rate", type=float, default=1.5, help="mean requests/s")
    p.add_argument("--duration", type=float, default=90.0, help="seconds of arrivals")
    p.add_argument("--burst-intensity", type=float, default=2.5)
    p.add_argument("--burst-share", type=float, default=0.35)
    p.add_argument("--lengths", default="uniform:32:256:32:256")
    p.add_argument("--ttft-slo", type=float)
    p.add_argument("--tbt-slo", type=float)
    p.add_argument("--tds", type=float)
    p.add_argument("--num-kv-blocks", type=int, default=0, help="0: the servers' default")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--log-dir", type=Path, default=Path("runs/policies_on_engine"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in args.system}
    for round_index in range(args.rounds):
        for name, serve_args in args.system:
            runs[name].append(bench_once(args, name, serve_args, round_index))
    summary = {name: medians(rows) for name, rows in runs.items()}
    first = args.system[0][0]
    result = {
        "workload": {k: getattr(args, k) for k in ("workload", "rate", "duration", "lengths",
                                                   "burst_intensity", "burst_share",
                                                   "ttft_slo", "tbt_slo", "tds",
                                                   "num_kv_blocks", "rounds", "seed")},
        "systems": {name: " ".join(serve_args) for name, serve_args in args.system},
        "median": summary,
        "ratios_vs_" + first: {n: ratios(summary[first], s) for n, s in summary.items()
                               if n != first},
        "rounds": runs,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
