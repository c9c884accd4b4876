"""Preemptions under KV pressure: the simulated vLLM v1 loop vs vLLM CPU itself.

    .venv/bin/python benchmarks/preemptions_vs_vllm.py [--num-requests 8]
        [--prompt-len 1500] [--output-len 300] [--num-kv-blocks 40] [--block-size 128]

N requests of distinct random token ids (P prompt tokens, O output tokens with
`ignore_eos`) are sent together to vLLM CPU's OpenAI server, started with
`--num-gpu-blocks-override K` (K blocks of B tokens: less than the requests need
together) and its default automatic prefix caching, and its preemption counter
(`vllm:num_preemptions_total` in /metrics) is read before and after. The same requests,
all arriving at once, are then simulated (`andante simulate --policy vllm
--num-kv-blocks K --block-size B`, same token budget and sequence limit): once as vLLM
runs (every prompt has content of its own, so a preempted request finds its freed
blocks again) and once with prefix caching off (what the simulator did before issue 30
for prompts without content ids: every preemption recomputes from scratch).

Prints ONE JSON line: preemptions per request of vLLM, of the simulation, and of the
simulation without caching. vLLM's half is skipped, with a message, where the venv or the
model directory is missing (benchmarks/peers/setup).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

import httpx

from andante.engine.config import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload.spec import RequestSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_paths import VLLM_MODEL, VLLM_PYTHON  # noqa: E402
from serve_vs_vllm import free_port, start, stop  # noqa: E402

PREEMPTIONS = re.compile(r"^vllm:num_preemptions(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+]+)",
                         re.MULTILINE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--num-requests", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1500)
    p.add_argument("--output-len", type=int, default=300)
    p.add_argument("--num-kv-blocks", type=int, default=40)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm-python", default=str(VLLM_PYTHON))
    p.add_argument("--model-dir", type=Path, default=VLLM_MODEL)
    p.add_argument("--log-dir", type=Path, default=Path("runs/preemptions_vs_vllm"))
    p.add_argument("--start-timeout", type=float, default=300.0)
    return p.parse_args(argv)


def simulated(args: argparse.Namespace, caching: bool) -> dict[str, Any]:
    """The same requests, arriving together, on one simulated instance of K blocks."""
    workload = [RequestSpec(arrival_time=0.0, prompt_len=args.prompt_len,
                            output_len=args.output_len) for _ in range(args.num_requests)]
    spec = ClusterSpec(model="smollm2-135m", policy="vllm", num_kv_blocks=args.num_kv_blocks,
                       scheduler=SchedulerConfig(
                           block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens,
                           max_model_len=args.max_model_len, enable_prefix_caching=caching))
    run = simulate(spec, workload)
    preemptions = sum(len(r.timeline.preemption_times) for r in run.requests)
    return {"num_finished": run.summary.num_finished, "num_preemptions": preemptions,
            "preemptions_per_request": round(preemptions / args.num_requests, 3)}


def vllm_command(args: argparse.Namespace, port: int) -> list[str]:
    return [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(args.model_dir), "--served-model-name", "smollm2",
            "--dtype", "bfloat16", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(args.max_model_len),
            "--max-num-seqs", str(args.max_num_seqs),
            "--max-num-batched-tokens", str(args.max_num_batched_tokens),
            "--block-size", str(args.block_size),
            "--num-gpu-blocks-override", str(args.num_kv_blocks)]


def read_preemptions(base: str) -> float:
    text = httpx.get(base + "/metrics", timeout=30).text
    return sum(float(m.group(1)) for m in PREEMPTIONS.finditer(text))


async def _send_all(base: str, prompts: list[list[int]], output_len: int) -> int:
    async with httpx.AsyncClient(timeout=1800) as client:
        async def one(prompt: list[int]) -> bool:
            body = {"model": "smollm2", "prompt": prompt, "max_tokens": output_len,
                    "min_tokens": output_len, "ignore_eos": True, "temperature": 0.0}
            response = await client.post(base + "/v1/completions", json=body)
            return response.status_code == 200
        done = await asyncio.gather(*(one(p) for p in prompts))
    return sum(done)


def measured(args: argparse.Namespace) -> dict[str, Any]:
    if not (Path(args.vllm_python).is_file() and (args.model_dir / "config.json").is_file()):
        return {"skipped": f"vLLM CPU or its model missing ({args.vllm_python}, "
                f"{args.model_dir}): run benchmarks/peers/setup"}
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(1000, 40000) for _ in range(args.prompt_len)]
               for _ in range(args.num_requests)]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start(vllm_command(args, port), port, args.log_dir / "vllm.log", args.start_timeout)
    try:
        base = f"http://127.0.0.1:{port}"
        before = read_preemptions(base)
        finished = asyncio.run(_send_all(base, prompts, args.output_len))
        preemptions = read_preemptions(base) - before
    finally:
        stop(proc)
    return {"num_finished": finished, "num_preemptions": int(preemptions),
            "preemptions_per_request": round(preemptions / args.num_requests, 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(json.dumps({
        "benchmark": "preemptions_vs_vllm", "num_requests": args.num_requests,
        "prompt_len": args.prompt_len, "output_len": args.output_len,
        "num_kv_blocks": args.num_kv_blocks, "block_size": args.block_size,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "simulated": simulated(args, caching=True),
        "simulated_without_caching": simulated(args, caching=False),
        "vllm": measured(args), "loadavg_1m": round(os.getloadavg()[0], 2),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
