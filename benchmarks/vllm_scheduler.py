"""vLLM + andante's scheduler class (andes) against vLLM's own scheduler, on vLLM CPU.

    .venv/bin/python benchmarks/vllm_scheduler.py [--rounds 3] [--num-prompts 60]
        [--rate 2] [--burstiness 0.2] [--policy andes] [--cost-only] [--serve-only]

Serving (issue 25's measure): two `vllm serve` servers with the same limits, one with
`--scheduler-cls andante.vllm.Scheduler` and `{"andante": {"policy": POLICY}}`, one
with vLLM's default scheduler, each started once; then `--rounds` rounds, each driving
both in turn (order alternating) with vLLM's own load generator (`vllm bench serve`,
called from Python as ENVIRONMENT.md says: the `random` dataset, `--burstiness` < 1 for
Gamma-distributed bursts, `--ignore-eos`, the same seed for both within a round). Per
server and round: mean QoE (Andes eq. 1-3 on each request's token timeline from the
client's TTFT and ITLs, andante's default targets: TTFT 1 s, 4.8 tokens/s), request
goodput (`--goodput ttft:.. tpot:..`), TTFT p99, output throughput; the JSON gives the
medians over rounds and each round.

Scheduler cost: `schedule` + `update_from_output` per step, in-process without a model
(andante.vllm.replay), at `--cost-running` (256) running requests decoding and
`--cost-waiting` (1,000) waiting behind them, for andante's class with POLICY and with
`vllm`, and vLLM's default scheduler.

Prints ONE JSON line, with the load average before and after (the machine is shared:
figures move with its load; compare within one run only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_paths import REPO, VLLM_MODEL, VLLM_PYTHON  # noqa: E402
from serve_vs_vllm import free_port, start, stop  # noqa: E402

from andante.metrics.qoe import qoe  # noqa: E402

KEYS = ("mean_qoe", "request_goodput", "p99_ttft_ms", "output_throughput")
BENCH_SERVE = ("import sys; from argparse import ArgumentParser; "
               "from vllm.benchmarks.serve import add_cli_args, main; "
               "p = ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def server_command(args: argparse.Namespace, port: int, policy: str | None) -> list[str]:
    cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(args.model_dir), "--served-model-name", "smollm2", "--dtype", "bfloat16",
           "--max-model-len", "2048", "--max-num-batched-tokens", "2048",
           "--max-num-seqs", str(args.max_num_seqs), "--enforce-eager",
           "--no-async-scheduling", "--no-enable-prefix-caching",
           "--num-gpu-blocks-override", str(args.num_blocks),
           "--host", "127.0.0.1", "--port", str(port)]
    if policy:
        config = {"andante": {"policy": policy, "log_interval": 0}}
        cmd += ["--scheduler-cls", "andante.vllm.Scheduler",
                "--additional-config", json.dumps(config)]
    return cmd


def bench_serve(args: argparse.Namespace, port: int, seed: int, out: Path) -> dict[str, Any]:
    """One `vllm bench serve` run; its saved result with per-request details."""
    cmd = [args.vllm_python, "-c", BENCH_SERVE, "--backend", "openai", "--base-url",
           f"http://127.0.0.1:{port}", "--model", "smollm2", "--tokenizer",
           str(args.model_dir), "--dataset-name", "random", "--random-input-len",
           str(args.input_len), "--random-output-len", str(args.output_len),
           "--random-range-ratio", "0.5", "--num-prompts", str(args.num_prompts),
           "--request-rate", str(args.rate), "--burstiness", str(args.burstiness),
           "--seed", str(seed), "--ignore-eos", "--disable-tqdm", "--save-result",
           "--save-detailed", "--result-dir", str(out.parent), "--result-filename",
           out.name, "--goodput", f"ttft:{args.goodput_ttft_ms}",
           f"tpot:{args.goodput_tpot_ms}", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99"]
    subprocess.run(cmd, check=True, capture_output=True, env=_env(), timeout=3600)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The round's figures: the client's own, plus mean QoE from each request's timeline."""
    values = []
    for ttft, itls, error in zip(result["ttfts"], result["itls"], result["errors"],
                                 strict=True):
        if error or not ttft:
            values.append(0.0)
            continue
        times, t = [ttft], ttft
        for gap in itls:
            t += gap
            times.append(t)
        values.append(qoe(0.0, times))
    return {"mean_qoe": statistics.fmean(values), "request_goodput": result["request_goodput"],
            "p99_ttft_ms": result["p99_ttft_ms"], "output_throughput": result["output_throughput"],
            "num_completed": result["completed"]}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def serving(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    names = {args.policy: args.policy, "vllm-default": None}
    ports = {name: free_port() for name in names}
    procs = {}
    os.environ["PYTHONPATH"] = str(REPO)  # the servers import andante.vllm from here
    try:
        for name, policy in names.items():
            procs[name] = start(server_command(args, ports[name], policy), ports[name],
                                workdir / f"{name}.log", args.start_timeout)
        rounds: list[dict[str, Any]] = []
        for number in range(args.rounds):
            order = list(names) if number % 2 == 0 else list(reversed(names))
            entry: dict[str, Any] = {"load_average": load_average()}
            for name in order:
                result = bench_serve(args, ports[name], args.seed + number,
                                     workdir / f"{name}-{number}.json")
                entry[name] = figures(result)
            rounds.append(entry)
    finally:
        for proc in procs.values():
            stop(proc)
    medians = {name: {k: statistics.median(r[name][k] for r in rounds) for k in KEYS}
               for name in names}
    ours, theirs = medians[args.policy], medians["vllm-default"]
    return {"medians": medians, "rounds": rounds, "targets_met": {
        "mean_qoe_higher": ours["mean_qoe"] > theirs["mean_qoe"],
        "goodput_higher": ours["request_goodput"] > theirs["request_goodput"],
        "ttft_p99_within_1.5x": ours["p99_ttft_ms"] <= 1.5 * theirs["p99_ttft_ms"],
        "throughput_at_least_0.95x": ours["output_throughput"] >= 0.95 * theirs[
            "output_throughput"]}}


def step_costs(args: argparse.Namespace) -> dict[str, Any]:
    """ms per step at --cost-running running and --cost-waiting waiting requests."""
    out = {}
    runs = {f"andante-{args.policy}": ["--scheduler", "andante", "--policy", args.policy],
            "andante-vllm": ["--scheduler", "andante", "--policy", "vllm"],
            "vllm-default": ["--scheduler", "vllm"]}
    for name, which in runs.items():
        cmd = [args.vllm_python, "-m", "andante.vllm.replay", "--model", str(args.model_dir),
               "--num-blocks", str(args.cost_running * 24 + 64), "--max-prompt", "32",
               "--max-num-batched-tokens", "8192", "--max-model-len", "2048",
               "--cost", str(args.cost_running), str(args.cost_waiting),
               str(args.cost_steps), *which]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=_env(),
                              timeout=1800)
        out[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", default="andes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=60)
    p.add_argument("--rate", type=float, default=2.0, help="mean requests/s")
    p.add_argument("--burstiness", type=float, default=0.2,
                   help="Gamma shape of inter-arrivals (< 1: bursts)")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=96)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--num-blocks", type=int, default=24,
                   help="KV blocks of 128 tokens (--num-gpu-blocks-override)")
    p.add_argument("--goodput-ttft-ms", type=float, default=2000)
    p.add_argument("--goodput-tpot-ms", type=float, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=600)
    p.add_argument("--cost-running", type=int, default=256)
    p.add_argument("--cost-waiting", type=int, default=1000)
    p.add_argument("--cost-steps", type=int, default=200)
    p.add_argument("--cost-only", action="store_true")
    p.add_argument("--serve-only", action="store_true")
    p.add_argument("--vllm-python", default=str(VLLM_PYTHON))
    p.add_argument("--model-dir", type=Path, default=VLLM_MODEL)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(args.vllm_python).is_file() or not (args.model_dir / "config.json").is_file():
        print(json.dumps({"error": f"vLLM peer missing ({args.vllm_python}, "
                                   f"{args.model_dir}): benchmarks/peers/setup --only vllm"}))
        return 1
    out: dict[str, Any] = {"benchmark": "vllm_scheduler", "policy": args.policy,
                           "load_average_before": load_average()}
    if not args.cost_only:
        with tempfile.TemporaryDirectory() as tmp:
            out["workload"] = {k: getattr(args, k) for k in (
                "num_prompts", "rate", "burstiness", "input_len", "output_len",
                "max_num_seqs", "num_blocks", "rounds")}
            out["serving"] = serving(args, Path(tmp))
    if not args.serve_only:
        out["step_cost_ms"] = step_costs(args)
    out["load_average_after"] = load_average()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
