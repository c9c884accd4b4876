"""Where the TTFT tail's time goes, from `andante serve --trace-steps` files.

    .venv/bin/python benchmarks/trace_summary.py TRACE.jsonl [TRACE.jsonl ...]
        [--slowest 5] [--min-prompt 32] [--since SECONDS]

For each trace (e.g. from `serve_vs_vllm.py --trace-dir DIR`): the steps' overhead
(wall time between forward passes) and forward durations, how many steps carried
prompts and how many carried several, the server-side TTFT median / p99, the garbage
collector's pauses, and the slowest requests broken down into
  to_engine = waiting for the step in progress when the request reached the server
              (`in_flight`: until that step ended) plus the step boundary (`boundary`),
  queue     = taken in by the engine -> first scheduled (the policy's choice),
  prefill   = first scheduled -> first token (`prefill_steps` steps, the first of which
              carried `prompts_in_step` prompts and `tokens_in_step` tokens).
`--min-prompt` leaves out the warm-up requests (shorter prompts); `--since` keeps the
requests that arrived that many seconds after the trace's first one (e.g. the burst workload
after serve_vs_vllm's Poisson one). Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1000 * value, 2)


def _pct(values: list[float], q: float) -> float | None:
    return _ms(float(np.percentile(values, q))) if values else None


def read(path: Path) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {"step": [], "request": [], "gc": []}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            kinds.setdefault(record["kind"], []).append(record)
    return kinds


def breakdown(req: dict[str, Any], steps: list[dict[str, Any]],
              ends: list[float]) -> dict[str, Any]:
    """One request's TTFT in parts (see the module note)."""
    i = bisect.bisect_right(ends, req["arrival"])  # the step in flight at arrival
    in_flight = ends[i] - req["arrival"] if i < len(ends) else None
    first = next((s for s in steps[i:] if req["id"] in s["prefill_ids"]), None)
    return {"id": req["id"], "prompt": req["prompt"], "ttft_ms": _ms(req["ttft"]),
            "to_engine_ms": _ms(req["to_engine"]), "in_flight_ms": _ms(in_flight),
            "boundary_ms": _ms(None if in_flight is None or req["to_engine"] is None
                               else req["to_engine"] - in_flight),
            "queue_ms": _ms(req["queue"]), "prefill_ms": _ms(req["prefill"]),
            "prefill_steps": req["prefill_steps"],
            "prompts_in_step": None if first is None else len(first["prefill_ids"]),
            "tokens_in_step": None if first is None else first["num_tokens"],
            "preemptions": req["num_preemptions"]}


def summarize(path: Path, slowest: int, min_prompt: int, since: float) -> dict[str, Any]:
    kinds = read(path)
    steps = kinds["step"]
    start = min((r["arrival"] for r in kinds["request"]), default=0.0)
    reqs = [r for r in kinds["request"] if r["prompt"] >= min_prompt and r["ttft"] is not None
            and r["arrival"] >= start + since]
    overhead = [s["overhead"] for s in steps if s["overhead"] is not None]
    prefill_steps = [s for s in steps if s["prefill_ids"]]
    ttfts = [r["ttft"] for r in reqs]
    ends = [s["t"] for s in steps]
    worst = sorted(reqs, key=lambda r: -r["ttft"])[:slowest]
    return {
        "trace": str(path), "num_steps": len(steps), "num_requests": len(reqs),
        "overhead_ms": {"median": _pct(overhead, 50), "p90": _pct(overhead, 90),
                        "p99": _pct(overhead, 99)},
        "forward_ms": {"median": _pct([s["duration"] for s in steps], 50),
                       "prompt_step_median": _pct([s["duration"] for s in prefill_steps], 50),
                       "prompt_step_p99": _pct([s["duration"] for s in prefill_steps], 99)},
        "num_prompt_steps": len(prefill_steps),
        "num_multi_prompt_steps": sum(len(s["prefill_ids"]) > 1 for s in steps),
        "max_prompts_in_step": max((len(s["prefill_ids"]) for s in steps), default=0),
        "num_split_prompts": sum((r["prefill_steps"] or 0) > 1 for r in reqs),
        "num_queued_after_step": sum(s["num_waiting"] > 0 for s in steps),
        "ttft_ms": {"median": _pct(ttfts, 50), "p99": _pct(ttfts, 99)},
        "gc_pauses_ms": [[r["generation"], _ms(r["pause"])] for r in kinds["gc"]],
        "slowest": [breakdown(r, steps, ends) for r in worst],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--slowest", type=int, default=5)
    p.add_argument("--min-prompt", type=int, default=32,
                   help="leave out requests with shorter prompts (the warm-up)")
    p.add_argument("--since", type=float, default=0.0,
                   help="keep requests that arrived this many seconds into the trace")
    args = p.parse_args(argv)
    missing = [str(t) for t in args.traces if not t.is_file()]
    if missing:
        print(f"trace_summary.py: error: no such trace {missing}", file=sys.stderr)
        return 2
    try:
        out = [summarize(t, args.slowest, args.min_prompt, args.since) for t in args.traces]
    except (ValueError, KeyError) as exc:
        print(f"trace_summary.py: error: not a step trace ({exc})", file=sys.stderr)
        return 2
    print(json.dumps({"traces": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
