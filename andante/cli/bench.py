"""`andante bench`: replay a workload against any OpenAI-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from andante.cli.options import parse_goodput, positive_float, positive_int
from andante.cli.output import per_request_rows
from andante.cli.progress import Progress
from andante.cli.workload_args import add_workload_args, workload_from_args
from andante.metrics import format_table
from andante.workload import build_workload


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server (andante serve, vllm serve, ...)",
        description="Replay a workload (arrivals, lengths, SLOs) against a server and report "
        "the `vllm bench serve` metrics plus QoE and SLO attainment.",
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key")
    p.add_argument("--model", help="default: the server's first model")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--prompt-format", default="tokens",
                   help="tokens[:LOW:HIGH] (token-id prompts of exact length, default "
                   "tokens:1000:41000) or text (about one word per token)")
    p.add_argument("--no-objectives", action="store_true",
                   help="do not send the per-request slo/priority fields")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="let the model stop early (default: exactly the sampled output length)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-concurrency", type=positive_int)
    p.add_argument("--timeout", type=positive_float, default=600.0, help="per request (s)")
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="e.g. ttft:1000 tpot:100")
    p.add_argument("--label", default="bench", help="column name in the table")
    p.add_argument("--output", type=Path, help="write summary and per-request rows (JSON)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress on stderr (default: a bar on a terminal, else a line "
                   "every 10 s)")
    add_workload_args(p, default_num=200)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import httpx

    from andante.bench.load import BenchConfig, run_bench
    from andante.bench.prompts import PromptFormat
    from andante.client import ClientError

    config = BenchConfig(
        base_url=args.base_url, api_key=args.api_key, model=args.model,
        endpoint=args.endpoint, prompt_format=PromptFormat.parse(args.prompt_format),
        send_objectives=not args.no_objectives, ignore_eos=not args.no_ignore_eos,
        temperature=args.temperature, max_concurrency=args.max_concurrency,
        timeout=args.timeout, seed=args.seed, goodput=parse_goodput(args.goodput),
    )
    specs = build_workload(workload_from_args(args))
    progress = Progress(len(specs), args.label, enabled=args.progress)
    try:
        result = asyncio.run(run_bench(specs, config, lambda _r: progress.advance()))
    except (httpx.HTTPError, ClientError) as exc:
        print(f"andante bench: cannot use the server at {args.base_url}: {exc}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    meta = {"label": args.label, "base_url": args.base_url, "workload": args.workload,
            "rate": args.rate, "rate_scale": args.rate_scale, "seed": args.seed}
    out = {**meta, **result.to_dict()}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{result.model} at {args.base_url}: workload {args.workload} rate {args.rate}/s "
              f"x{args.rate_scale}, {len(specs)} requests, seed {args.seed}")
        print(format_table({args.label: result.summary}))
        for error in result.errors[:5]:
            print(f"error: {error}")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({**out, "requests": per_request_rows(result.records)},
                                          indent=2))
    return 0
