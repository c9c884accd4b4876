"""`andante simulate`: run a workload on a simulated cluster under one or more policies."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from andante.cli.options import parse_goodput, parse_key_values, positive_int
from andante.cli.output import write_run
from andante.cli.progress import Progress
from andante.cli.workload_args import add_workload_args, workload_from_args
from andante.core.request import PreemptionMode
from andante.metrics import format_table
from andante.perf.catalog import hardware_names, model_names
from andante.policies import SchedulerConfig, policy_names
from andante.sim import ClusterSpec, SimRun, simulate
from andante.sim.cluster_file import load_cluster_file
from andante.sim.setup import with_router
from andante.workload import build_workload
from andante.workload.mixes import assign_models, parse_model_mix


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate a GPU cluster running the real scheduler",
        description="Replay a workload on simulated instances of the real engine.",
    )
    p.add_argument("--hardware", default="a100-80g", help=f"one of {', '.join(hardware_names())}")
    p.add_argument("--model", default="llama-3.1-8b", help=f"one of {', '.join(model_names())}")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel GPUs/stage")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline stages per instance")
    p.add_argument("--instances", type=positive_int, default=1)
    p.add_argument("--router", default="round-robin",
                   help="round-robin, least-loaded, power-of-two, ascendra (LP/HP pools)")
    p.add_argument("--hp-instances", type=positive_int, default=1, help="router ascendra")
    p.add_argument("--router-option", action="append", metavar="KEY=VALUE")
    p.add_argument("--cluster", type=Path, metavar="FILE",
                   help="TOML cluster file (andante.sim.cluster_file); flags: its defaults")
    p.add_argument("--model-mix", metavar="NAME:WEIGHT,...",
                   help="each request asks for one of these models (QLM multi-model)")
    p.add_argument("--policy", default="vllm", help=f"one of {', '.join(policy_names())}")
    p.add_argument("--compare", help="comma-separated policies to run on the same workload")
    p.add_argument("--policy-option", action="append", metavar="KEY=VALUE")
    _add_engine_args(p)
    add_workload_args(p)
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="e.g. ttft:1000 tpot:100")
    p.add_argument("--until", type=float, help="stop the simulation at this simulated time")
    p.add_argument("--output", type=Path, help="write per-request metrics and summaries here")
    p.add_argument("--json", action="store_true", help="print summaries as JSON lines")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.set_defaults(run=run)


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=positive_int, default=256)
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=8192)
    g.add_argument("--max-model-len", type=positive_int, default=8192)
    g.add_argument("--block-size", type=positive_int, default=16)
    g.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    g.add_argument("--swap-space", type=float, default=4.0, help="host KV GiB per GPU")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)


def cluster_from_args(args: argparse.Namespace, policy: str) -> ClusterSpec:
    scheduler = SchedulerConfig(
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(args.max_num_batched_tokens, args.max_model_len),
        max_model_len=args.max_model_len,
        preemption_mode=PreemptionMode[args.preemption_mode.upper()],
    )
    spec = ClusterSpec(
        model=args.model,
        hardware=args.hardware,
        tp=args.tp,
        pp=args.pp,
        num_instances=args.instances,
        policy=policy,
        policy_options=parse_key_values(args.policy_option),
        scheduler=scheduler,
        swap_space_gib=args.swap_space,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    spec = with_router(spec, args.router, args.hp_instances)
    spec = dataclasses.replace(spec, router_options=parse_key_values(args.router_option))
    if args.cluster is None:
        return spec
    spec = load_cluster_file(args.cluster, spec)
    return dataclasses.replace(spec, policy=policy) if args.compare else spec


def run(args: argparse.Namespace) -> int:
    policies = args.compare.split(",") if args.compare else [args.policy]
    config = workload_from_args(args)
    workload = build_workload(config)
    if args.model_mix:
        workload = assign_models(workload, parse_model_mix(args.model_mix), args.seed)
    if args.max_context is None:  # never feed the engine prompts it must refuse
        workload = [w for w in workload if w.prompt_len < args.max_model_len]
    goodput = parse_goodput(args.goodput)
    runs: dict[str, SimRun] = {}
    for policy in policies:
        spec = cluster_from_args(args, policy.strip())
        progress = Progress(len(workload), f"{policy:>10}", enabled=args.progress)
        runs[policy] = simulate(spec, workload, args.until, None, progress.on_item, goodput)
        progress.close()
    _print(runs, args)
    if args.output is not None:
        for policy, sim_run in runs.items():
            write_run(args.output / policy, sim_run.records, sim_run.summary, _meta(sim_run))
    return 0


def _meta(sim_run: SimRun) -> dict[str, Any]:
    spec = sim_run.spec
    return {
        "model": spec.model, "hardware": spec.hardware, "tp": spec.tp,
        "instances": spec.num_instances, "policy": spec.policy,
        "simulated_seconds": sim_run.report.end_time, "wall_seconds": sim_run.wall_seconds,
        "num_unfinished": len(sim_run.report.unfinished),
        "router": spec.router, "num_model_swaps": len(sim_run.report.model_swaps),
        **sim_run.report.router_counters,
    }


def _print(runs: dict[str, SimRun], args: argparse.Namespace) -> None:
    if args.json:
        for policy, sim_run in runs.items():
            print(json.dumps({"policy": policy, **_meta(sim_run), **sim_run.summary.to_dict()}))
        return
    first = next(iter(runs.values())).spec
    print(
        f"{first.model} on {first.num_instances} x {first.hardware} (tp={first.tp}), "
        f"workload {args.workload} rate {args.rate}/s x{args.rate_scale}, seed {args.seed}"
    )
    print(format_table({p: r.summary for p, r in runs.items()}))
