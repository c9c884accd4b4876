"""andante's simulator against Vidur on the same simulation, every andante policy in one run.

One workload (10,000 Poisson requests at 1.5/s with ShareGPT lengths, prompt + output
<= 8192, by default) is simulated by Vidur (vidur==0.0.26, its vLLM scheduler) and by
andante under every registered policy. Both simulate the same model on the same
hardware with the same step costs: andante's llama-3.1-8b on one a100-80g, which Vidur
knows as meta-llama/Llama-3-8B (same shape), profiled from andante's cost model
(benchmarks/vidur_peer/profile_tables.py); the same batch cap, token budget, block
size, watermark and KV blocks; and Vidur replays exactly andante's requests (arrival
times and lengths) from a trace file. Rounds interleave Vidur and the policies.

Prints ONE JSON line: per system (vidur, andante/<policy>) the medians over rounds of
simulated requests per wall-second and per CPU-second of the simulation loop,
simulated seconds, completed requests and mean TTFT / E2E latency (the check that
both simulate a similar timeline), the per-round rates with the load average around
each run, and andante's rate relative to Vidur's.

Needs `benchmarks/peers/setup --only vidur` (the Vidur venv and dataset under
$ANDANTE_PEERS); refuses with a message (exit 2) when they are missing or stale.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from andante.engine.config import SchedulerConfig
from andante.policies import policy_names
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec, WorkloadConfig, build_workload

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "vidur_peer"))
import profile_tables  # noqa: E402  (benchmarks/vidur_peer is not a package)

RUN_VIDUR = HERE / "vidur_peer" / "run_vidur.sh"
TRACE_DATE = "2023-08-21"  # the Date Vidur's trace-replay generator selects by default
VIDUR = "vidur"


def peers_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    return Path(os.environ.get("ANDANTE_PEERS") or HERE.parent / "runs" / "peers")


def setup_problem(peers: Path, cfg: profile_tables.ProfileConfig) -> str | None:
    """Why Vidur cannot run here (a sentence naming the fix), or None."""
    hint = f"run benchmarks/peers/setup --only vidur (ANDANTE_PEERS={peers})"
    if not (peers / "vidur-venv" / "bin" / "python").is_file():
        return f"no Vidur venv at {peers / 'vidur-venv'}: {hint}"
    problem = profile_tables.dataset_problem(cfg, peers / "vidur-data")
    return None if problem is None else f"{problem}: {hint}"


def write_trace(workload: Sequence[RequestSpec], path: Path) -> None:
    """The workload in the columns of Vidur's trace-replay generator."""
    with path.open("w", encoding="utf-8") as out:
        out.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        for spec in workload:
            out.write(f"{TRACE_DATE},{spec.arrival_time!r},{spec.prompt_len},{spec.output_len}\n")


def run_vidur(peers: Path, trace: Path, mode: str, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "ANDANTE_PEERS": str(peers), "VIDUR_TRACE": str(trace)}
    load = os.getloadavg()[0]
    proc = subprocess.run([str(RUN_VIDUR), "0", "0", mode], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"Vidur failed (exit {proc.returncode}):\n{tail}")
    out = json.loads(lines[-1])
    return {
        "requests_per_wall_s": out["requests_per_wall_s"],
        "requests_per_cpu_s": out["requests_per_cpu_s"],
        "completed": out["completed"],
        "simulated_seconds": round(out["simulated_seconds"], 1),
        "mean_ttft_s": out["mean_ttft_s"],
        "mean_e2e_s": out["mean_e2e_s"],
        "num_batches": out["num_batches"],
        "num_restarts": out["num_restarts"],
        "sim_wall_s": out["loop_s"],
        "startup_s": out["startup_s"],
        "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def run_andante(cfg: profile_tables.ProfileConfig, policy: str,
                workload: Sequence[RequestSpec]) -> dict[str, Any]:
    scheduler = SchedulerConfig(block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
                                max_num_batched_tokens=cfg.max_tokens,
                                max_model_len=cfg.max_tokens, watermark=cfg.watermark,
                                enable_prefix_caching=False)
    spec = ClusterSpec(model=cfg.model, hardware=cfg.hardware, policy=policy,
                       scheduler=scheduler, gpu_memory_utilization=cfg.gpu_memory_utilization)
    load = os.getloadavg()[0]
    cpu_started = time.process_time()
    run = simulate(spec, workload, keep_records=False)
    cpu = time.process_time() - cpu_started
    n, summary = len(workload), run.summary
    return {
        "requests_per_wall_s": round(n / run.wall_seconds, 1),
        "requests_per_cpu_s": round(n / cpu, 1),
        "completed": summary.num_finished,
        "simulated_seconds": round(run.report.end_time, 1),
        "mean_ttft_s": _rounded(summary.ttft.mean),
        "mean_e2e_s": _rounded(summary.e2el.mean),
        "num_steps": sum(s.num_steps for s in run.report.instance_stats),
        "sim_wall_s": round(run.wall_seconds, 3),
        "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def _rounded(value: float) -> float | None:
    return None if value != value else round(value, 4)  # NaN: nothing completed


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the numeric fields over rounds, plus each round's rates and load."""
    out: dict[str, Any] = {}
    for key, value in rounds[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in rounds if r[key] is not None]
            out[key] = round(statistics.median(values), 4) if values else None
    out["rounds"] = [{k: r[k] for k in ("requests_per_wall_s", "requests_per_cpu_s",
                                        "loadavg_1m")} for r in rounds]
    return out


def relative(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each andante policy's rates as multiples of Vidur's, and its mean latencies over
    Vidur's (near 1 for vllm: the same timeline)."""
    vidur = results[VIDUR]
    out = {}
    for name, res in results.items():
        if name == VIDUR:
            continue
        row = {f"{k}_x": round(res[k] / vidur[k], 2)
               for k in ("requests_per_wall_s", "requests_per_cpu_s")}
        for k in ("mean_ttft_s", "mean_e2e_s"):
            if res[k] and vidur[k]:
                row[f"{k}_ratio"] = round(res[k] / vidur[k], 3)
        out[name] = row
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1.5, help="Poisson arrivals per second")
    parser.add_argument("--lengths", default="sharegpt", help="as `andante simulate --lengths`")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="all",
                        help="comma-separated andante policies, or all (every registered one)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repeats (medians)")
    parser.add_argument("--vidur-mode", default="minimal",
                        choices=("minimal", "off", "native", "default"),
                        help="Vidur's metrics (run_vidur.sh MODE); minimal keeps request "
                             "metrics, as andante's streamed summary does")
    parser.add_argument("--vidur-timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--peers", default=None,
                        help="peers folder (default $ANDANTE_PEERS, else runs/peers)")
    args = parser.parse_args(argv)
    if args.num_requests < 1 or args.rounds < 1 or args.rate <= 0:
        parser.error("--num-requests and --rounds must be >= 1 and --rate > 0")
    known = policy_names()
    args.policy_list = known if args.policies == "all" else args.policies.split(",")
    unknown = [p for p in args.policy_list if p not in known]
    if unknown:
        parser.error(f"unknown policies {unknown}; valid: {', '.join(known)}")
    return args


def run_rounds(args: argparse.Namespace, cfg: profile_tables.ProfileConfig, peers: Path,
               workload: list[RequestSpec], trace: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {VIDUR: []}
    for round_index in range(args.rounds):
        systems = [VIDUR, *args.policy_list]
        if round_index % 2:  # alternate the order so no system always runs first
            systems.reverse()
        for system in systems:
            if system == VIDUR:
                runs[VIDUR].append(run_vidur(peers, trace, args.vidur_mode, args.vidur_timeout))
            else:
                runs.setdefault(f"andante/{system}", []).append(
                    run_andante(cfg, system, workload))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg, peers = profile_tables.ProfileConfig(), peers_dir(args.peers)
    problem = setup_problem(peers, cfg)
    if problem is not None:
        print(f"sim_vs_vidur: error: {problem}", file=sys.stderr)
        return 2
    workload = build_workload(WorkloadConfig(
        kind="poisson", rate=args.rate, num_requests=args.num_requests,
        lengths=args.lengths, max_context=cfg.max_tokens, seed=args.seed))
    with tempfile.TemporaryDirectory(prefix="sim_vs_vidur-") as tmp:
        trace = Path(tmp) / "requests.csv"
        write_trace(workload, trace)
        try:
            runs = run_rounds(args, cfg, peers, workload, trace)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"sim_vs_vidur: error: {exc}", file=sys.stderr)
            return 1
    results = {name: median_of(rounds) for name, rounds in runs.items()}
    print(json.dumps({
        "benchmark": "sim_vs_vidur", "num_requests": len(workload), "rate": args.rate,
        "lengths": args.lengths, "seed": args.seed, "rounds": args.rounds,
        "model": cfg.model, "hardware": cfg.hardware, "vidur_model": cfg.vidur_model,
        "vidur_device": cfg.device, "vidur_mode": args.vidur_mode,
        "engine": {"max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_tokens,
                   "block_size": cfg.block_size,
                   "kv_blocks": profile_tables.kv_capacity_blocks(cfg)},
        "results": results, "relative_to_vidur": relative(results),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
