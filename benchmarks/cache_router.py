"""The cache-aware router vs least-loaded (and round-robin) on a conversation trace with
block ids: prefix-cache hit rate and TTFT on N simulated instances.

    .venv/bin/python benchmarks/cache_router.py [--trace FILE.jsonl] [--instances 10]
        [--conversations 600] [--rate 2.0] [--routers least-loaded,cache-aware,round-robin]

Without `--trace`, a Mooncake-format trace is generated (benchmarks/conversation_trace.py:
multi-turn conversations over a few shared system prompts, 512-token block ids).
Each router replays it through `andante simulate`'s path (llama-3.1-8b on A100-80G by
default, prefix caching on). Prints ONE JSON line: per router the hit rate, saved prefill
tokens, TTFT mean / p50 / p99 (ms), requests finished; and the trace's ceiling hit rate
(one cache that never evicts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from andante.engine.config import SchedulerConfig
from andante.perf.catalog import get_model
from andante.sim import ClusterSpec, simulate
from andante.workload.prefix import with_trace_ids
from andante.workload.spec import RequestSpec
from andante.workload.traces import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conversation_trace import ceiling_hit_rate, conversation_turns, write_trace  # noqa: E402


def run_router(router: str, workload: list[RequestSpec], args: argparse.Namespace
               ) -> dict[str, Any]:
    context = get_model(args.model).max_model_len  # as `andante simulate` by default
    spec = ClusterSpec(model=args.model, hardware=args.hardware, num_instances=args.instances,
                       router=router, scheduler=SchedulerConfig(max_model_len=context))
    summary = simulate(spec, workload, keep_records=False).summary
    return {"hit_rate": round(summary.prefix_cache_hit_rate, 4),
            "saved_prefill_tokens": summary.saved_prefill_tokens,
            "ttft_mean_ms": round(summary.ttft.mean * 1000, 1),
            "ttft_p50_ms": round(summary.ttft.median * 1000, 1),
            "ttft_p99_ms": round(summary.ttft.p99 * 1000, 1),
            "num_finished": summary.num_finished}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trace", type=Path)
    p.add_argument("--instances", type=int, default=10)
    p.add_argument("--conversations", type=int, default=600)
    p.add_argument("--rate", type=float, default=2.0, help="conversations per second")
    p.add_argument("--routers", default="least-loaded,cache-aware,round-robin")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--hardware", default="a100-80g")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ceiling = None
    path = args.trace
    if path is None:
        turns = conversation_turns(args.conversations, args.rate, 4.0, 4, 2048, args.seed)
        ceiling = round(ceiling_hit_rate(turns), 4)
        path = Path(tempfile.mkdtemp()) / "conversations.jsonl"
        write_trace(path, turns)
    trace = load_trace(path)
    workload = with_trace_ids([RequestSpec(float(t), int(p_), int(o)) for t, p_, o in zip(
        trace.arrival_times, trace.prompt_lens, trace.output_lens, strict=True)], trace)
    results = {router: run_router(router, workload, args) for router in args.routers.split(",")}
    out = {"benchmark": "cache_router", "trace": str(path), "rows": len(workload),
           "instances": args.instances, "model": args.model, "hardware": args.hardware,
           "ceiling_hit_rate": ceiling, "results": results,
           "loadavg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
