"""Workload flags shared by `simulate`, `bench` and `experiment`."""

from __future__ import annotations

import argparse

from andante.cli.options import positive_float, positive_int
from andante.workload import KNOWN_FORMATS, SLOConfig, WorkloadConfig, parse_kind
from andante.workload.builder import SYNTHETIC_KINDS
from andante.workload.formats import MAPPING_FORM

TRACE_FORMATS = "columns recognised by name: " + "; ".join(
    f"{f.about}: {', '.join(f.names(True))}{' (ms)' if f.unit == 'ms' else ''}"
    for f in KNOWN_FORMATS if f.time is not None)


def add_workload_args(parser: argparse.ArgumentParser, default_num: int = 2000) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--workload", default="poisson",
        help="arrival process: poisson, gamma, burst (default poisson); azure-conv or "
        "azure-code (the Azure 2023 traces under --traces-dir); or trace:PATH, a CSV or JSONL "
        f"trace replayed whole (unless --num-requests or --duration cut it), {TRACE_FORMATS}",
    )
    g.add_argument("--rate", type=positive_float, default=4.0, help="requests/s (default 4)")
    g.add_argument("--cv", type=positive_float, default=1.0, help="gamma: inter-arrival CV")
    g.add_argument("--burst-intensity", type=float, default=2.0, help="burst rate / mean rate")
    g.add_argument("--burst-share", type=float, default=0.35, help="share of a cycle in burst")
    g.add_argument("--cycle-length", type=positive_float, default=1200.0, help="burst cycle (s)")
    g.add_argument("--num-requests", type=positive_int,
                   help=f"stop after this many arrivals (synthetic default {default_num}; "
                   "a trace is replayed whole)")
    g.add_argument("--trace-columns", metavar="MAPPING",
                   help=f"columns of a trace:PATH in another format: {MAPPING_FORM}")
    parser.set_defaults(default_num_requests=default_num)
    g.add_argument("--duration", type=positive_float, help="stop arrivals after this many s")
    g.add_argument(
        "--lengths",
        help="default: a replayed trace's own lengths, else sharegpt. sharegpt (the "
        "ShareGPT lengths under --traces-dir), sharegpt:PATH (a CSV with "
        "num_prefill_tokens, num_decode_tokens), fixed:P:O, uniform:a:b:c:d (prompt in "
        "[a,b], output in [c,d]), trace (the replayed trace's own lengths), azure-conv, "
        "azure-code, or trace:PATH (lengths sampled from any trace file above)",
    )
    g.add_argument("--max-context", type=positive_int, help="drop sampled rows longer than this")
    g.add_argument("--prefix-sharing", metavar="SPEC",
                   help="prompts that share prefixes (for the prefix cache): system:N (every "
                   "prompt starts with the same N-token system prompt) or conversation:C "
                   "(the requests are the turns of C conversations in turn, each prompt the "
                   "previous turn's prompt + answer + new text); optional :SPAN, tokens per "
                   "content id (default 16). A Mooncake trace's hash_ids are used as they are")
    g.add_argument("--rate-scale", type=positive_float, default=1.0, help="multiply the rate")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--traces-dir", help="folder of the traces (default ../shared/traces)")
    g.add_argument("--model-mix", metavar="NAME:WEIGHT,...",
                   help="each request asks for a model drawn by these weights (several "
                   "models in one workload, QLM), e.g. mistral-7b:3,llama-3.1-8b:1")
    s = parser.add_argument_group("per-request objectives")
    s.add_argument("--ttft-slo", type=positive_float, help="fixed TTFT SLO (s)")
    s.add_argument("--tbt-slo", type=positive_float, help="TBT SLO (s)")
    s.add_argument("--tds", type=positive_float, help="fixed reading speed (tokens/s)")
    s.add_argument("--deadline", type=positive_float, help="end-to-end deadline (s)")
    s.add_argument("--deadline-per-token", type=positive_float, help="deadline slope (s/token)")
    s.add_argument("--prefill-throughput", type=positive_float, default=5000.0,
                   help="TTFT target = max(prompt / this, 1 s) (Andes; default 5000 tok/s)")


def workload_from_args(args: argparse.Namespace) -> WorkloadConfig:
    slo = SLOConfig(
        prefill_throughput=args.prefill_throughput,
        ttft=args.ttft_slo,
        tds=args.tds,
        tbt=args.tbt_slo,
        deadline=args.deadline,
        deadline_per_token=args.deadline_per_token,
    )
    kind, _ = parse_kind(args.workload)
    num = args.num_requests
    if num is None and args.duration is None and kind in SYNTHETIC_KINDS:
        num = args.default_num_requests
    return WorkloadConfig(
        kind=args.workload,
        rate=args.rate,
        cv=args.cv,
        burst_intensity=args.burst_intensity,
        burst_share=args.burst_share,
        cycle_length=args.cycle_length,
        num_requests=num,
        duration=args.duration,
        lengths=args.lengths or ("sharegpt" if kind in SYNTHETIC_KINDS else "trace"),
        max_context=args.max_context,
        rate_scale=args.rate_scale,
        seed=args.seed,
        slo=slo,
        traces_dir=args.traces_dir,
        trace_columns=args.trace_columns,
        prefix_sharing=args.prefix_sharing,
        model_mix=args.model_mix,
    )
