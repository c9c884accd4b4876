"""`andante generate`: complete prompts offline with the real engine and scheduler."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from andante.cli.options import add_prefix_caching_arg, positive_int


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate",
        help="complete prompts with a real model (default: embedded SmolLM2-135M)",
        description="Run prompts through the real scheduler and the torch executor.",
    )
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts")
    p.add_argument("--model", help="HF model directory or .gguf file (default: embedded)")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    p.add_argument("--system", help="system message (with --chat)")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=positive_int)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--policy", default="vllm", help="scheduling policy")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--json", action="store_true", help="one JSON line per prompt")
    add_prefix_caching_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from andante.core.sampling import SamplingParams
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.llm import build_offline_engine, generate
    from andante.models.loader import load_model

    sampling = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), ignore_eos=args.ignore_eos)
    started = time.perf_counter()
    model = load_model(args.model, args.dtype)
    executor = TorchExecutor(model, TorchExecutorOptions(
        dtype=args.dtype, num_threads=args.threads, kv_cache_gib=args.kv_cache_gib))
    engine = build_offline_engine(model, args.policy, executor=executor,
                                  enable_prefix_caching=args.enable_prefix_caching)
    loaded = time.perf_counter()
    results = generate(args.prompts, sampling, model=model, chat=args.chat,
                       system=args.system, engine=engine)
    elapsed = time.perf_counter() - loaded
    for prompt, result in zip(args.prompts, results, strict=True):
        if args.json:
            timeline = result.request.timeline
            ttft = timeline.token_times[0] - timeline.arrival_time if timeline.token_times else None
            print(json.dumps({"prompt": prompt, "text": result.text,
                              "num_output_tokens": len(result.token_ids),
                              "finish_reason": result.finish_reason, "ttft_s": ttft}))
        else:
            print(result.text)
    num_tokens = sum(len(r.token_ids) for r in results)
    print(f"[{model.name}: loaded in {loaded - started:.1f} s; {num_tokens} tokens in "
          f"{elapsed:.2f} s, {num_tokens / max(elapsed, 1e-9):.1f} tok/s]", file=sys.stderr)
    return 0
