"""`andante simulate`: run a workload on a simulated cluster under one or more policies."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andante.cli.options import (
    add_prefix_caching_arg,
    block_size,
    parse_goodput,
    parse_key_values,
    positive_int,
)
from andante.cli.output import record_files, write_summary
from andante.cli.progress import Progress
from andante.cli.workload_args import add_workload_args, workload_from_args
from andante.cluster.registry import PoolMember, engine_policy_for, router_entry
from andante.core.request import PreemptionMode
from andante.engine.policy import parse_options
from andante.metrics import Summary, format_table
from andante.perf.catalog import (
    describe_hardware,
    get_hardware,
    get_model,
    hardware_names,
    model_names,
)
from andante.policies import SchedulerConfig, policy_class, policy_names
from andante.sim import ClusterSpec, SimRun, simulate
from andante.sim.cluster_file import load_cluster_file
from andante.sim.setup import with_router
from andante.workload import RequestSpec, Trace, build_workload_traced


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
                   help="round-robin, least-loaded, power-of-two, ascendra (LP/HP pools), "
                   "kunserve (drop layers into pipeline groups under KV pressure; "
                   "--router-option drop_threshold=1.0 restore_threshold=0.5 "
                   "kv_mode=auto|exchange|recompute link=rdma-200g coordinated= "
                   "lookahead= restore= drop= max_members=)")
    p.add_argument("--hp-instances", type=positive_int, default=1,
                   help="router ascendra: instances in the HP pool (the rest are LP)")
    p.add_argument("--policy", help=f"one of {', '.join(policy_names())} (default vllm; "
                   "router ascendra runs its own ascendra-lp and ascendra-hp)")
    p.add_argument("--router-option", action="append", metavar="KEY=VALUE")
    p.add_argument("--cluster", type=Path, metavar="FILE",
                   help="TOML cluster file (andante.sim.cluster_file); flags: its defaults")
    p.add_argument("--compare", help="comma-separated policies to run on the same workload")
    p.add_argument("--policy-option", action="append", metavar="KEY=VALUE",
                   help="a policy tunable, read as its declared type (none/null where allowed); "
                   "router ascendra: lp.KEY=VALUE or hp.KEY=VALUE")
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
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=8192,
                   help="step token budget; raised to --max-model-len for policies that "
                   "prefill whole prompts (as vLLM v0 without chunked prefill)")
    g.add_argument("--max-model-len", type=positive_int,
                   help="prompt + output limit (default and maximum: the model's context)")
    g.add_argument("--block-size", type=block_size, default=16,
                   help="KV block tokens: 1, 8, 16, 32, 64, 128 or 256 (vLLM's sizes)")
    g.add_argument("--preemption-mode", choices=["recompute", "swap"],
                   help="default: recompute, or the policy's own choice (andes: the cheaper "
                   "per request; fastserve: proactive swap)")
    g.add_argument("--swap-space", type=float, default=4.0, help="host KV GiB per GPU")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--num-kv-blocks", type=positive_int,
                   help="device KV blocks per instance, whatever the memory leaves "
                   "(vLLM's --num-gpu-blocks-override)")
    add_prefix_caching_arg(g)


def max_model_len_from_args(args: argparse.Namespace) -> int:
    """`--max-model-len`, by default the model's context; never above it."""
    context = get_model(args.model).max_model_len
    if args.max_model_len is None:
        return context
    if args.max_model_len > context:
        raise ValueError(f"--max-model-len {args.max_model_len} exceeds the context of "
                         f"{args.model} ({context} tokens)")
    return int(args.max_model_len)


def token_budget(policies: list[str], requested: int, max_model_len: int) -> int:
    """The step budget: as requested where every policy chunks prefills; raised to
    max_model_len where one prefills whole prompts (vLLM v0's rule without chunked
    prefill), or a long prompt could never be scheduled."""
    chunks = all(getattr(policy_class(p), "chunks_prefill", False) for p in policies)
    return requested if chunks else max(requested, max_model_len)


def pools_from_args(args: argparse.Namespace) -> list[PoolMember] | None:
    """The pools of a router that runs its own policies, one per pool (ascendra: LP and
    HP, the last --hp-instances), or None."""
    pool_plan = router_entry(args.router).hook("pool_plan")
    if pool_plan is None:
        return None
    plan: list[PoolMember] = pool_plan(args.instances, args.hp_instances,
                                       parse_key_values(args.policy_option))
    return plan


def policies_from_args(args: argparse.Namespace) -> list[str]:
    """The runs' labels, each checked before any runs: the policies of --policy or
    --compare, or the router's name where its pools run their own policies."""
    if router_entry(args.router).pool_plan is not None:
        if args.policy is not None or args.compare:
            raise ValueError(f"--router {args.router} runs its own policies, one per pool: "
                             "drop --policy/--compare")
        pools_from_args(args)
        return [args.router]
    names = [n.strip() for n in args.compare.split(",")] if args.compare else [
        engine_policy_for(args.router, args.policy) or "vllm"]
    for name in names:
        policy_options_from_args(args, name)
    return names


def policy_options_from_args(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    """--policy-option values (checked against the policy's declared types), plus what
    makes the policy honour an explicit --preemption-mode."""
    options = parse_key_values(args.policy_option)
    if router_entry(args.router).pool_plan is not None:
        return options  # keys for the pools' policies, checked by the pool plan
    cls = policy_class(policy)
    if args.preemption_mode is not None and hasattr(cls, "preemption_options"):
        mode = PreemptionMode[args.preemption_mode.upper()]
        for key, value in cls.preemption_options(mode).items():
            if str(options.setdefault(key, value)) != str(value):
                raise ValueError(f"--preemption-mode {args.preemption_mode} contradicts "
                                 f"--policy-option {key}={options[key]} of {policy}")
    if hasattr(cls, "Options"):
        parse_options(cls.Options, options, policy)
    return options


def cluster_from_args(args: argparse.Namespace, policy: str) -> ClusterSpec:
    pools = pools_from_args(args)
    policies = [policy] if pools is None else [m.policy for m in pools]
    policy = policies[0]  # with pools, theirs replace it (with_router)
    max_model_len = max_model_len_from_args(args)
    budget = token_budget(policies, args.max_num_batched_tokens, max_model_len)
    scheduler = SchedulerConfig(
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        preemption_mode=PreemptionMode[(args.preemption_mode or "recompute").upper()],
        enable_prefix_caching=args.enable_prefix_caching,
        max_model_len_set_by=None if args.max_model_len is None
        else f"--max-model-len {args.max_model_len}",
    )
    spec = ClusterSpec(
        model=args.model,
        hardware=args.hardware,
        tp=args.tp,
        pp=args.pp,
        num_instances=args.instances,
        policy=policy,
        policy_options=policy_options_from_args(args, policy),
        scheduler=scheduler,
        swap_space_gib=args.swap_space,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_kv_blocks=args.num_kv_blocks,
    )
    spec = with_router(spec, args.router, args.hp_instances)
    spec = dataclasses.replace(spec, router_options=parse_key_values(args.router_option))
    if args.cluster is None:
        return spec
    spec = load_cluster_file(args.cluster, spec)
    return dataclasses.replace(spec, policy=policy) if args.compare else spec


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What a run leaves once its records are written: the summary and its context."""

    summary: Summary
    meta: dict[str, Any]
    header: str
    profile: str  # the hardware profile and its fit error (`describe_hardware`)


def run(args: argparse.Namespace) -> int:
    policies = _once_each(policies_from_args(args))
    config = workload_from_args(args)
    workload, trace = build_workload_traced(config)
    goodput = parse_goodput(args.goodput)
    outcomes = {policy: _run_one(args, policy, workload, goodput) for policy in policies}
    if trace is not None:
        for outcome in outcomes.values():
            outcome.meta["num_zero_token_rows"] = trace.num_zero_token_rows
    _print(outcomes, args, _workload_line(args, trace, len(workload)))
    return 0


def _once_each(policies: list[str]) -> list[str]:
    """The policies in order, each once; says which were listed more than once."""
    unique = list(dict.fromkeys(policies))
    repeated = [p for p in unique if policies.count(p) > 1]
    if repeated:
        print(f"--compare lists {', '.join(repeated)} more than once: each runs once "
              "(the simulation is deterministic)", file=sys.stderr)
    return unique


def _run_one(args: argparse.Namespace, policy: str, workload: list[RequestSpec],
             goodput: dict[str, float] | None) -> _Outcome:
    """Simulate one policy, streaming its records (to --output if given): only the
    summary is held, so memory does not grow with the requests or the policies."""
    spec = cluster_from_args(args, policy)
    progress = Progress(len(workload), f"{policy:>10}", enabled=args.progress)
    with ExitStack() as stack:
        sink = None if args.output is None else stack.enter_context(
            record_files(args.output / policy))
        sim_run = simulate(spec, workload, args.until, None, progress.on_item, goodput,
                           keep_records=False, on_record=sink)
    progress.close()
    meta = _meta(sim_run, policy)
    if args.output is not None:
        write_summary(args.output / policy, sim_run.summary, meta)
    header = f"{spec.model} on {spec.num_instances} x {spec.hardware} (tp={spec.tp})"
    return _Outcome(sim_run.summary, meta, header, describe_hardware(spec.hardware))


def _meta(sim_run: SimRun, label: str) -> dict[str, Any]:
    spec = sim_run.spec
    return {
        "model": spec.model, "hardware": spec.hardware, "tp": spec.tp,
        "instances": spec.num_instances, "policy": label,
        "simulated_seconds": sim_run.report.end_time, "wall_seconds": sim_run.wall_seconds,
        "num_unfinished": len(sim_run.report.unfinished),
        "num_stalls": sim_run.report.num_stalls,
        "router": spec.router, "num_model_swaps": len(sim_run.report.model_swaps),
        "profile_fit_error": get_hardware(spec.hardware).fit_error,
        **sim_run.report.router_counters,
    }


def _workload_line(args: argparse.Namespace, trace: Trace | None, num: int) -> str:
    """The workload part of the header: a synthetic rate, or a trace's rows and format."""
    if trace is None:
        return f"workload {args.workload} rate {args.rate}/s x{args.rate_scale}, seed {args.seed}"
    zero = (f" ({trace.num_zero_token_rows} rows with 0 tokens run as 1 token)"
            if trace.num_zero_token_rows else "")
    return (f"trace {trace.source} ({trace.format} columns): {trace.num_rows} rows read, "
            f"{num} replayed{zero} x{args.rate_scale} speed, seed {args.seed}")


def _print(outcomes: dict[str, _Outcome], args: argparse.Namespace, workload: str) -> None:
    if args.json:
        for outcome in outcomes.values():
            print(json.dumps({**outcome.meta, **outcome.summary.to_dict()}))
        return
    first = next(iter(outcomes.values()))
    print(f"{first.header}, {workload}")
    print(f"hardware profile: {first.profile}")
    print(format_table({p: o.summary for p, o in outcomes.items()}))
    for policy, outcome in outcomes.items():
        summary = outcome.summary
        _print_stalls(policy, outcome.meta, args.until)
        if summary.num_rejected:
            print(f"{policy}: {summary.num_rejected} rejected; the first:")
            for line in summary.first_rejections:
                print(f"  {line}")


def _print_stalls(policy: str, meta: dict[str, Any], until: float | None) -> None:
    """Say when an instance stalled (work it could never schedule: requests refused,
    andante.engine.stall) and when requests are left unfinished without --until."""
    if meta["num_stalls"]:
        print(f"{policy}: an instance stalled (work it could not schedule); "
              f"{meta['num_stalls']} request(s) refused to resolve it (reasons below)")
    if meta["num_unfinished"] and until is None:
        print(f"{policy}: {meta['num_unfinished']} request(s) unfinished although no "
              "--until was given")
