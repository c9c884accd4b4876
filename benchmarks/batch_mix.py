"""Batch + interactive mix on the real engine: interactive TTFT with and without a
running batch, and the batch's completion against its window.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/batch_mix.py --rounds 2

One `andante serve` (in-process, the embedded SmolLM2-135M on the CPU) with its SQLite
batch queue in a temporary directory. Each round runs the same interactive workload
(Poisson arrivals of streaming completions, token-id prompts, `ignore_eos`) twice:
alone, then while a batch of `--batch-requests` short requests runs (submitted just
before; the feeder's rule: batch work starts only while no interactive request waits
for its first token, at most `--batch-max-in-flight` at once). After the interactive
phase the batch runs on to completion; its duration is compared with its window.

Target (issue 17): interactive TTFT p99 with the batch within 20% of alone, and the
batch done within its window. Prints ONE JSON line: per round and as medians over the
rounds the TTFT p50/p99 alone and with the batch, their ratio, the batch's progress
during the interactive phase, its duration and window, and each round's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from typing import Any

import httpx

from andante.bench.load import BenchConfig, run_bench
from andante.runtime.durable.records import window_seconds
from andante.server import EngineOptions, ServeOptions, ServerThread
from andante.server.config import BatchOptions
from andante.workload import RequestSpec

FINISHED = ("completed", "failed", "expired", "cancelled")


def interactive_specs(args: argparse.Namespace) -> list[RequestSpec]:
    rng = random.Random(args.seed)
    specs, now = [], 0.0
    for _ in range(args.interactive):
        now += rng.expovariate(args.rate)
        specs.append(RequestSpec(now, args.prompt_len, args.output_len))
    return specs


def batch_file(args: argparse.Namespace) -> bytes:
    rng = random.Random(args.seed + 1)
    lines = []
    for i in range(args.batch_requests):
        prompt = [rng.randrange(100, 20000) for _ in range(args.prompt_len)]
        lines.append(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions",
                                 "body": {"prompt": prompt, "max_tokens": args.batch_output_len,
                                          "ignore_eos": True, "temperature": 0}}))
    return ("\n".join(lines) + "\n").encode()


def submit_batch(url: str, content: bytes, window: str) -> str:
    uploaded = httpx.post(f"{url}/v1/files", files={"file": ("mix.jsonl", content)},
                          data={"purpose": "batch"}, timeout=60).json()
    created = httpx.post(f"{url}/v1/batches", timeout=60, json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/completions",
        "completion_window": window}).json()
    return str(created["id"])


def batch_state(url: str, batch_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/batches/{batch_id}", timeout=60).json())


def ttfts(url: str, specs: list[RequestSpec]) -> dict[str, float]:
    cfg = BenchConfig(base_url=url, send_objectives=False, timeout=600)
    run = asyncio.run(run_bench(specs, cfg))
    assert not run.errors, run.errors[:3]
    s = run.summary.to_dict()
    return {"ttft_p50_ms": float(s["median_ttft_ms"] or 0),
            "ttft_p99_ms": float(s["p99_ttft_ms"] or 0)}


def one_round(url: str, args: argparse.Namespace) -> dict[str, Any]:
    specs = interactive_specs(args)
    load_alone = _loadavg()
    alone = ttfts(url, specs)
    batch_id = submit_batch(url, batch_file(args), args.window)
    started = time.monotonic()
    load_mix = _loadavg()
    mixed = ttfts(url, specs)
    during = batch_state(url, batch_id)["request_counts"]
    while (state := batch_state(url, batch_id))["status"] not in FINISHED:
        time.sleep(0.5)
    duration = time.monotonic() - started
    counts = state["request_counts"]
    return {
        "alone": alone, "with_batch": mixed,
        "p99_ratio": mixed["ttft_p99_ms"] / alone["ttft_p99_ms"],
        "p50_ratio": mixed["ttft_p50_ms"] / alone["ttft_p50_ms"],
        "batch": {"status": state["status"], "completed": counts["completed"],
                  "failed": counts["failed"], "total": counts["total"],
                  "done_during_interactive": during["completed"] + during["failed"],
                  "duration_s": round(duration, 1), "window_s": window_seconds(args.window),
                  "within_window": state["status"] == "completed"
                  and duration <= window_seconds(args.window)},
        "loadavg": {"alone": load_alone, "with_batch": load_mix},
    }


def _loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def _median(rounds: list[dict[str, Any]], *path: str) -> float:
    values = []
    for r in rounds:
        value: Any = r
        for key in path:
            value = value[key]
        values.append(float(value))
    return round(statistics.median(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interactive", type=int, default=40, help="interactive requests")
    parser.add_argument("--rate", type=float, default=1.0, help="interactive requests/s")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--batch-requests", type=int, default=600)
    parser.add_argument("--batch-output-len", type=int, default=16)
    parser.add_argument("--batch-max-in-flight", type=int, default=None,
                        help="default: the server's (a quarter of --max-num-seqs)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--window", default="1h")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state_dir:
        options = ServeOptions(
            port=0, log_level="warning",
            engine=EngineOptions(max_num_seqs=args.max_num_seqs, num_threads=args.threads),
            batch=BatchOptions(state_dir=state_dir, max_in_flight=args.batch_max_in_flight))
        with ServerThread(options) as server:
            in_flight = server._app.state.batches.feeder.max_in_flight
            rounds = [one_round(server.url, args) for _ in range(args.rounds)]
    print(json.dumps({
        "benchmark": "batch_mix", "model": "smollm2-135m (embedded, CPU)",
        "interactive": {"requests": args.interactive, "rate": args.rate,
                        "prompt_len": args.prompt_len, "output_len": args.output_len},
        "batch_requests": args.batch_requests, "batch_output_len": args.batch_output_len,
        "batch_max_in_flight": in_flight,
        "median": {"ttft_p99_alone_ms": _median(rounds, "alone", "ttft_p99_ms"),
                   "ttft_p99_with_batch_ms": _median(rounds, "with_batch", "ttft_p99_ms"),
                   "ttft_p50_alone_ms": _median(rounds, "alone", "ttft_p50_ms"),
                   "ttft_p50_with_batch_ms": _median(rounds, "with_batch", "ttft_p50_ms"),
                   "p99_ratio": _median(rounds, "p99_ratio"),
                   "batch_duration_s": _median(rounds, "batch", "duration_s")},
        "rounds": rounds,
    }))


if __name__ == "__main__":
    main()
