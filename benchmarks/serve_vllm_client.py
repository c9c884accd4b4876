"""`andante serve` and vLLM CPU's OpenAI server, both with their defaults, measured by
vLLM's own load generator (`vllm bench serve`) as issue 32's table is.

    .venv/bin/python benchmarks/serve_vllm_client.py [--loads c16,poisson2]
        [--backends openai-chat,openai] [--rounds 1] [--systems andante,vllm]

Loads (random dataset, 256 prompt + 128 output tokens, `ignore_eos`, the vLLM peer's
tokenizer): `c16` = `--max-concurrency 16` with `--c16-prompts` requests at once;
`poisson2` = `--request-rate 2` with `--poisson-prompts` requests; `burst2` = the same
rate with `--burstiness 0.2` (Gamma bursts). Goodput counts requests within TTFT <= 1 s
and TPOT <= 100 ms, as the issue's table. Each round starts each server (andante:
`andante serve` with no engine options, `--dtype auto` included; vLLM:
`--dtype bfloat16 --enforce-eager`, VLLM_CPU_KVCACHE_SPACE=2, both cores), warms it up,
runs every load and backend with one `vllm bench serve` process (vLLM imported once),
and stops it; servers alternate within a round. Prints ONE JSON line: per system, load
and backend, the medians over rounds of the bench's figures, with each run's load
average and others' CPU share.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from peer_paths import VLLM_MODEL, VLLM_PYTHON  # noqa: E402
from serve_vs_vllm import free_port, start, stop, warm_up  # noqa: E402

NAME = "smollm2"
FIGURES = ("completed", "failed", "output_throughput", "request_goodput", "mean_ttft_ms",
           "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "duration")
BENCH_DRIVER = """
import argparse, json, sys
from vllm.benchmarks.serve import add_cli_args, main
for args in json.loads(sys.argv[1]):
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(args))
"""


def load_args(args: argparse.Namespace, load: str) -> list[str]:
    if load == "c16":
        return ["--max-concurrency", "16", "--num-prompts", str(args.c16_prompts)]
    rate = ["--request-rate", "2", "--num-prompts", str(args.poisson_prompts)]
    if load == "poisson2":
        return rate
    if load == "burst2":
        return [*rate, "--burstiness", "0.2"]
    raise ValueError(f"unknown load {load!r}")


def bench_runs(args: argparse.Namespace, url: str, out_dir: Path) -> list[list[str]]:
    endpoints = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
    runs = []
    for load in args.loads.split(","):
        for backend in args.backends.split(","):
            runs.append([
                "--backend", backend, "--base-url", url, "--endpoint", endpoints[backend],
                "--model", NAME, "--tokenizer", str(args.model_dir), "--dataset-name", "random",
                "--random-input-len", "256", "--random-output-len", "128", "--ignore-eos",
                "--disable-tqdm", "--seed", str(args.seed), "--goodput", "ttft:1000",
                "tpot:100", "--save-result", "--result-dir", str(out_dir),
                "--result-filename", f"{load}-{backend}.json", *load_args(args, load)])
    return runs


def machine_now() -> tuple[float, float, float]:
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [float(v) for v in fh.readline().split()[1:9]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy, sum(fields), os.getloadavg()[0]


def measure(args: argparse.Namespace, system: str) -> dict[str, Any]:
    port = free_port()
    if system == "andante":
        cmd = [sys.executable, "-m", "andante.cli.main", "serve", "--port", str(port),
               "--served-model-name", NAME, "--log-level", "warning"]
    else:
        cmd = [str(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(args.model_dir), "--served-model-name", NAME, "--dtype", "bfloat16",
               "--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]
    log = args.log_dir / f"{system}-{int(time.time())}.log"
    proc = start(cmd, port, log, args.start_timeout)
    try:
        warm_up(port)
        with tempfile.TemporaryDirectory() as tmp:
            busy0, total0, load0 = machine_now()
            done = subprocess.run(
                [str(args.vllm_python), "-c", BENCH_DRIVER,
                 json.dumps(bench_runs(args, f"http://127.0.0.1:{port}", Path(tmp)))],
                capture_output=True, text=True, cwd=tmp, check=False)
            busy1, total1, load1 = machine_now()
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            results = {p.stem: json.loads(p.read_text()) for p in Path(tmp).glob("*.json")}
    finally:
        stop(proc)
    figures = {key: {f: results[key].get(f) for f in FIGURES} for key in sorted(results)}
    # the whole machine's busy share (the bench client and both servers' own work included)
    return {"figures": figures, "loadavg_1m": [round(load0, 2), round(load1, 2)],
            "machine_busy_share": round((busy1 - busy0) / max(1e-9, total1 - total0), 3)}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]["figures"]:
        out[key] = {f: round(statistics.median(r["figures"][key][f] for r in runs), 2)
                    for f in FIGURES if all(isinstance(r["figures"][key].get(f), (int, float))
                                            for r in runs)}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default="andante,vllm")
    p.add_argument("--loads", default="c16,poisson2")
    p.add_argument("--backends", default="openai-chat")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--c16-prompts", type=int, default=48)
    p.add_argument("--poisson-prompts", type=int, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", type=Path, default=VLLM_MODEL)
    p.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", type=Path, default=Path("runs/serve_vllm_client"))
    args = p.parse_args(argv)
    for load in args.loads.split(","):
        try:
            load_args(args, load)
        except ValueError as exc:
            p.error(str(exc))
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    systems = args.systems.split(",")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for round_index in range(args.rounds):
        for system in systems:
            runs[system].append(measure(args, system))
            print(f"serve_vllm_client: round {round_index + 1} {system}: "
                  f"{json.dumps(runs[system][-1])}", file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "serve_vllm_client", "cpus": os.cpu_count(),
                      "medians": {s: medians(r) for s, r in runs.items()}, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
