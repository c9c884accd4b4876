"""andante serve vs vLLM CPU's OpenAI server on the same workloads, one after the other.

    .venv/bin/python benchmarks/serve_vs_vllm.py [--duration 60] [--rate 1]
        [--policy andes,vllm] [--andante-backend process,inprocess] [--rounds 3]
        [--workloads poisson,burst] [--trace-dir DIR]

`--policy` takes a comma-separated list: one andante server per policy, then vLLM, all
in one run (`andante` holds the first policy's figures, `andante_by_policy` every one's),
and `verdict` says, per andante policy and workload, whether it matches or beats vLLM
on goodput, TTFT p99 and mean QoE. `--andante-backend` (a list too) runs every policy on
each of those `andante serve --backend`s (labelled `policy@backend`); by default the
server picks its own. `--rounds N` runs all the servers N times in turn and reports
medians (`per_round` has every run, `runs` each run's load average). `--trace-dir DIR`
has every andante server write its step and request trace (`andante serve --trace-steps`:
per request, arrival, taken in by the engine, first scheduled, first token, prompt steps)
to DIR/POLICY-N.jsonl, to see where the TTFT tail's time goes.

For each server: start it (a subprocess on a free port), wait for /health, replay a
Poisson workload and then a cyclic-burst workload with `andante bench`'s load generator
(token-id prompts of exact length, `ignore_eos`, streaming; QoE judged with Andes' SLOs:
TTFT target max(prompt/5000, 1 s), reading speed drawn from the Andes reading
distribution), stop it (andante's engine processes with it: the server and its children
share a process group). Prints ONE JSON line: per server and workload ttft p50/p99, tpot
mean, output throughput, goodput (`--goodput`), mean QoE.

vLLM runs from its own venv (`--vllm-python`, default $ANDANTE_PEERS/vllm-venv/bin/python) on a
safetensors directory (`--model-dir`, made by benchmarks/vllm_peer/convert_gguf.py):
    python -m vllm.entrypoints.openai.api_server --model DIR --dtype bfloat16
        --max-model-len 2048 --max-num-seqs 64 --enforce-eager --no-enable-prefix-caching
        --host 127.0.0.1 --port P
with VLLM_CPU_KVCACHE_SPACE=2 and VLLM_CPU_NUM_OF_RESERVED_CPU=0. That half is skipped,
with a message in the JSON, when the venv or the model directory is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from andante.bench.load import BenchConfig, run_bench
from andante.bench.prompts import PromptFormat
from andante.policies import policy_names
from andante.workload import WorkloadConfig, build_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_paths import VLLM_MODEL, VLLM_PYTHON  # noqa: E402

KEYS = ("num_finished", "num_aborted", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "output_throughput", "request_throughput", "request_goodput", "mean_qoe",
        "slo_attainment")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def verdict(andante: dict[str, Any], vllm: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """Per workload: andante's goodput >= vLLM's, TTFT p99 <= vLLM's, mean QoE >= vLLM's."""
    out = {}
    for kind, ours in andante.items():
        theirs = vllm.get(kind) or {}
        if not all(isinstance(d.get(k), (int, float)) for d in (ours, theirs)
                   for k in ("request_goodput", "p99_ttft_ms", "mean_qoe")):
            continue
        out[kind] = {"goodput": ours["request_goodput"] >= theirs["request_goodput"],
                     "ttft_p99": ours["p99_ttft_ms"] <= theirs["p99_ttft_ms"],
                     "qoe": ours["mean_qoe"] >= theirs["mean_qoe"]}
    return out


def andante_command(args: argparse.Namespace, port: int, policy: str,
                    backend: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "andante.cli.main", "serve", "--port", str(port),
           "--policy", policy, "--max-queued", "100000", "--log-level", "warning",
           "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
           "--no-prefix-caching",  # like vLLM's side below: the same work for both
           "--dtype", "bfloat16"]  # as vLLM serves it (below)
    if args.andante_model:
        cmd += ["--model", args.andante_model]
    if args.andante_threads:
        cmd += ["--threads", str(args.andante_threads)]
    if backend:
        cmd += ["--backend", backend]
    for option in args.policy_option:
        cmd += ["--policy-option", option]
    if args.trace_dir:  # one file per server run (its runs are numbered in turn)
        args.trace_dir.mkdir(parents=True, exist_ok=True)
        runs = len(list(args.trace_dir.glob(f"{policy}-*.jsonl")))
        cmd += ["--trace-steps", str(args.trace_dir / f"{policy}-{runs}.jsonl")]
    return cmd


def vllm_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(args.model_dir), "--served-model-name", "smollm2", "--dtype", "bfloat16",
           "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
           "--host", "127.0.0.1", "--port", str(port), "--no-enable-prefix-caching"]
    return cmd + ([] if args.vllm_compile else ["--enforce-eager"])


def start(cmd: list[str], port: int, log: Path, timeout: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # its own group: stop() ends all
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    raise RuntimeError(f"server did not become healthy in {timeout} s; see {log}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the server and every process it started (vLLM's engine core and workers)."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            time.sleep(1.0)  # let the group's other members exit too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


def workloads(args: argparse.Namespace) -> dict[str, WorkloadConfig]:
    common = {"rate": args.rate, "duration": args.duration, "num_requests": 100_000,
              "lengths": args.lengths}
    every = {
        "poisson": WorkloadConfig(kind="poisson", seed=args.seed, **common),
        "burst": WorkloadConfig(kind="burst", seed=args.seed + 1,
                                burst_intensity=args.burst_intensity,
                                burst_share=args.burst_share, cycle_length=args.duration / 2,
                                **common),
    }
    return {kind: every[kind] for kind in args.workloads.split(",")}


def bench_server(args: argparse.Namespace, cmd: list[str], port: int, name: str) -> dict[str, Any]:
    proc = start(cmd, port, args.log_dir / f"{name}.log", args.start_timeout)
    try:
        warm_up(port)
        out: dict[str, Any] = {}
        for kind, config in workloads(args).items():
            # distinct prompts per workload (no prefix-cache reuse between them)
            cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}", seed=config.seed,
                              prompt_format=PromptFormat.parse(args.prompt_format),
                              goodput={"ttft": args.goodput_ttft_ms / 1000,
                                       "tpot": args.goodput_tpot_ms / 1000})
            run = asyncio.run(run_bench(build_workload(config), cfg))
            d = run.to_dict()
            out[kind] = {k: _round(d.get(k)) for k in KEYS} | {"num_errors": len(run.errors)}
        return out
    finally:
        stop(proc)


def warm_up(port: int) -> None:
    """A few requests first, so neither server is measured while warming up."""
    url = f"http://127.0.0.1:{port}/v1"
    model = httpx.get(url + "/models", timeout=30).json()["data"][0]["id"]
    for _ in range(3):
        httpx.post(url + "/completions", timeout=120,
                   json={"model": model, "prompt": "Hello, my name is", "max_tokens": 8})


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=1.0, help="mean requests/s")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per workload")
    p.add_argument("--lengths", default="uniform:32:256:16:128")
    p.add_argument("--burst-intensity", type=float, default=2.5, help="burst rate / mean rate")
    p.add_argument("--burst-share", type=float, default=0.3, help="share of a cycle in burst")
    p.add_argument("--prompt-format", default="tokens", help="as `andante bench`")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="andes" if "andes" in policy_names() else "vllm",
                   help="andante's policy, or a comma-separated list (one server each)")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to andante serve (repeatable)")
    p.add_argument("--andante-model", help="default: the embedded model")
    p.add_argument("--andante-backend", default="",
                   help="andante serve --backend, or a comma-separated list (one server per "
                   "policy and backend; default: the server's own choice)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every server this many times, in turn; figures are medians")
    p.add_argument("--andante-threads", type=int, default=None,
                   help="andante's torch threads (default: the server's own choice)")
    p.add_argument("--model-dir", type=Path, default=VLLM_MODEL,
                   help="converted model (default: $ANDANTE_VLLM_MODEL or $ANDANTE_PEERS/...)")
    p.add_argument("--vllm-python", default=str(VLLM_PYTHON),
                   help="vLLM venv's python (default: $ANDANTE_VLLM_PYTHON or $ANDANTE_PEERS/...)")
    p.add_argument("--vllm-compile", action="store_true",
                   help="let vLLM compile (default --enforce-eager: starts in ~20 s instead of "
                   "60-85 s, 5-10%% slower)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--goodput-ttft-ms", type=float, default=2000.0)
    p.add_argument("--goodput-tpot-ms", type=float, default=200.0)
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", type=Path, default=Path("runs/serve_vs_vllm"))
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--workloads", default="poisson,burst",
                   help="comma-separated, from poisson and burst (default both)")
    p.add_argument("--trace-dir", type=Path,
                   help="debugging: each andante server writes its step and request trace "
                   "(andante serve --trace-steps) to DIR/POLICY-N.jsonl")
    return p.parse_args(argv)


def andante_systems(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """(label, policy, backend) per andante server: every policy on every backend of
    `--andante-backend` (labelled `policy@backend` when there are several)."""
    policies = [p for p in args.policy.split(",") if p]
    backends = [b for b in args.andante_backend.split(",") if b] or [None]
    return [(p if len(backends) == 1 else f"{p}@{b}", p, b) for p in policies
            for b in backends]


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload, each figure's median over the rounds (None if a round lacks it)."""
    out: dict[str, Any] = {}
    for kind in rounds[0]:
        rows = [r[kind] for r in rounds]
        out[kind] = {k: _round(statistics.median(row[k] for row in rows))
                     if all(isinstance(row.get(k), (int, float)) for row in rows) else None
                     for k in rows[0]}
    return out


def run_rounds(args: argparse.Namespace, systems: list[tuple[str, Any]],
               result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every system once per round, in turn (a busy machine's noise spread over all);
    each run's load average before and after goes into `result["runs"]`. A vLLM server
    that does not start is left out (`result["vllm_error"]`); an andante one stops the
    run (RuntimeError)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in systems}
    log: list[dict[str, Any]] = result.setdefault("runs", [])
    for index in range(args.rounds):
        for name, command in systems:
            if name == "vllm" and "vllm_error" in result:
                continue
            port = free_port()
            before = list(os.getloadavg())
            try:
                runs[name].append(bench_server(args, command(port), port, f"{name}-{index}"))
            except RuntimeError as exc:
                if name != "vllm":
                    raise
                result["vllm_error"] = str(exc)
                continue
            log.append({"round": index, "system": name, "loadavg_before": before,
                        "loadavg_after": list(os.getloadavg())})
    return {name: rows for name, rows in runs.items() if rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = andante_systems(args)
    unknown = [p for _, p, _ in systems if p not in policy_names()]
    if not systems or unknown or args.rounds < 1:
        print(f"serve_vs_vllm.py: error: unknown policy {unknown or args.policy!r} (choose "
              f"from {', '.join(policy_names())}) or --rounds < 1", file=sys.stderr)
        return 2
    bad = set(args.workloads.split(",")) - {"poisson", "burst"}
    if bad or not args.workloads:
        print(f"serve_vs_vllm.py: error: unknown workload(s) {sorted(bad)} (choose from "
              "poisson, burst)", file=sys.stderr)
        return 2
    args.log_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"rate": args.rate, "duration": args.duration,
                              "lengths": args.lengths, "policy": args.policy,
                              "rounds": args.rounds,
                              "goodput_ms": {"ttft": args.goodput_ttft_ms,
                                             "tpot": args.goodput_tpot_ms},
                              "loadavg_before": list(os.getloadavg())}
    commands: list[tuple[str, Any]] = [
        (f"andante-{label}", functools.partial(andante_command, args, policy=policy,
                                                backend=backend))
        for label, policy, backend in systems]
    missing = [p for p in (Path(args.vllm_python), args.model_dir / "config.json")
               if not p.exists()]
    if args.skip_vllm or missing:
        result["vllm_skipped"] = "--skip-vllm" if args.skip_vllm else f"missing {missing}"
    else:
        commands.append(("vllm", functools.partial(vllm_command, args)))
    try:
        runs = run_rounds(args, commands, result)
    except RuntimeError as exc:  # an andante server that did not start
        print(f"serve_vs_vllm.py: error: {exc}", file=sys.stderr)
        return 1
    by_policy = {label: medians(runs[f"andante-{label}"]) for label, _, _ in systems}
    result["andante"], result["andante_by_policy"] = by_policy[systems[0][0]], by_policy
    result["vllm"] = medians(runs["vllm"]) if "vllm" in runs else None
    if args.rounds > 1:
        result["per_round"] = runs
    if result["vllm"] is not None:
        result["verdict"] = {p: verdict(r, result["vllm"]) for p, r in by_policy.items()}
    result["loadavg_after"] = list(os.getloadavg())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
