"""Drive a vLLM scheduler class in-process on a trace and record its decisions.

Design note. To check that andante's `vllm` policy inside vLLM decides as vLLM's own
scheduler does, both classes are built on the same vLLM config and KV cache (no model,
no executor: the model runner's output is synthesized, one token per request that
completes its prompt) and fed the same requests at the same steps; each step's
decision (tokens per request, requests preempted) is recorded. A trace is a CSV with
arrival timestamps and token counts (Azure LLM inference 2023: TIMESTAMP,
ContextTokens, GeneratedTokens); arrivals are mapped to steps at `--step-seconds`
per step, so both schedulers see request i arrive before the same step. Prompts are
distinct token ids per request (no prefix-cache hits between them) unless
`--shared-prefix` gives them a common start.

The same harness times a scheduler's `schedule()` + `update_from_output()` at a given
number of running and waiting requests (benchmarks/vllm_scheduler.py).

    python -m andante.vllm.replay --model DIR --trace CSV [--scheduler vllm|andante]
        [--policy vllm] [--num-requests 60] [--num-blocks 400] ...  # one JSON line

Needs vLLM (run it with vLLM's interpreter).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

VLLM_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
ANDANTE_SCHEDULER = "andante.vllm.Scheduler"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival: float  # seconds from the trace's first request
    prompt_len: int
    output_len: int


def read_trace(path: str, num: int, max_prompt: int, max_output: int) -> list[TraceRequest]:
    """The first `num` requests of an Azure-2023-style CSV, lengths capped."""
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as f:
        start = None
        for row in csv.DictReader(f):
            t = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            start = t if start is None else start
            out.append(TraceRequest(t - start, max(1, min(int(row["ContextTokens"]), max_prompt)),
                                    max(1, min(int(row["GeneratedTokens"]), max_output))))
            if len(out) == num:
                break
    return out


def build_scheduler(args: argparse.Namespace, qualname: str,
                    andante: dict[str, Any] | None = None, **scheduler_fields: Any) -> Any:
    """The scheduler class `qualname` on a vLLM config of `args` (`andante`: its
    additional_config object; `scheduler_fields`: SchedulerConfig fields set after the
    config is built, as vLLM's engine would have resolved them)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=args.model, dtype="bfloat16", max_model_len=args.max_model_len,
                        skip_tokenizer_init=True)
    sched = SchedulerConfig(max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            max_model_len=args.max_model_len, is_encoder_decoder=False,
                            async_scheduling=False)
    cache = CacheConfig(block_size=args.block_size, enable_prefix_caching=args.prefix_caching)
    cache.num_gpu_blocks = args.num_blocks
    config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                        additional_config={"andante": andante} if andante else {})
    for name, value in scheduler_fields.items():
        setattr(config.scheduler_config, name, value)
    spec = FullAttentionSpec(block_size=args.block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=args.num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cls = resolve_obj_by_qualname(qualname)
    return cls(vllm_config=config, kv_cache_config=kv,
               structured_output_manager=StructuredOutputManager(config),
               block_size=args.block_size, log_stats=False)


def make_request(index: int, spec: TraceRequest, args: argparse.Namespace,
                 arrival_time: float) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    base = 1000 + (index * 7919) % 40000  # distinct prompts: no accidental prefix hits
    prompt = [(base + k) % 49000 + 1 for k in range(spec.prompt_len)]
    if args.shared_prefix:
        prompt[: args.shared_prefix] = list(range(1, min(args.shared_prefix, spec.prompt_len) + 1))
    params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True, temperature=0.0)
    hasher = get_request_block_hasher(args.block_size, sha256) if args.prefix_caching else None
    return Request(request_id=f"r{index}", prompt_token_ids=prompt, sampling_params=params,
                   pooling_params=None, arrival_time=arrival_time, block_hasher=hasher)


def fake_output(output: Any, completing: set[str]) -> Any:
    """The model runner's output: token 7 for each request whose prompt is done."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = [[7] if rid in completing else [] for rid in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def step(sched: Any) -> tuple[dict[str, int], list[str]]:
    """One schedule + update; (tokens per request, requests preempted)."""
    output = sched.schedule()
    requests = sched.requests
    completing = {rid for rid in output.num_scheduled_tokens
                  if requests[rid].num_computed_tokens >= requests[rid].num_tokens}
    sched.update_from_output(output, fake_output(output, completing))
    return dict(output.num_scheduled_tokens), sorted(output.preempted_req_ids)


def consistency_errors(sched: Any) -> list[str]:
    """Where andante's view disagrees with vLLM's state (andante's scheduler only): the
    running list, the waiting set (a policy may keep its own order of it; vLLM's queue
    keeps arrival order, preempted first), and the blocks (free + held == total)."""
    errors = []
    running = [r.request_id for r in sched.mirror_running]
    if running != [r.request_id for r in sched.running]:
        errors.append(f"running {running} != vLLM's {[r.request_id for r in sched.running]}")
    waiting = sorted(r.request_id for r in sched.mirror_waiting)
    if waiting != sorted(r.request_id for r in sched.waiting):
        errors.append(f"waiting {waiting} != vLLM's {[r.request_id for r in sched.waiting]}")
    view = sched.kv_view
    tables = view.manager.coordinator.single_type_managers[0].req_to_blocks
    held = len({b.block_id for r in sched.running for b in tables.get(r.request_id, ())})
    free = view.num_free_device_blocks
    if held + free != view.num_device_blocks:
        errors.append(f"blocks: {held} held + {free} free != {view.num_device_blocks}")
    return errors


def replay(args: argparse.Namespace, qualname: str, policy: str | None,
           check: bool = False) -> tuple[list[dict[str, Any]], Any]:
    """Every step's decision for the trace, until all requests finish (or max steps),
    and the scheduler; with `check`, each step's `consistency_errors` too (andante's
    scheduler)."""
    trace = read_trace(args.trace, args.num_requests, args.max_prompt, args.max_output)
    sched = build_scheduler(args, qualname,
                            {"policy": policy, "log_interval": 0} if policy else None)
    arrivals = [int(r.arrival / args.step_seconds) for r in trace]
    t0 = time.time()
    steps: list[dict[str, Any]] = []
    index = 0
    for number in range(args.max_steps):
        while index < len(trace) and arrivals[index] <= number:
            sched.add_request(make_request(index, trace[index], args, t0 + trace[index].arrival))
            index += 1
        if index == len(trace) and not sched.get_num_unfinished_requests():
            break
        tokens, preempted = step(sched)
        record: dict[str, Any] = {"step": number, "tokens": tokens, "preempted": preempted}
        if check:
            record["errors"] = consistency_errors(sched)
        steps.append(record)
    return steps, sched


def step_cost(args: argparse.Namespace, qualname: str, policy: str | None,
              num_running: int, num_waiting: int, num_steps: int) -> dict[str, float]:
    """Milliseconds per step of the scheduler's own work (`schedule` +
    `update_from_output`, and the harness's synthetic model output, the same for every
    scheduler) with `num_running` requests decoding and `num_waiting` queued behind them
    (max_num_seqs = num_running: none of them can be admitted): wall-clock median and
    mean, and the process's CPU time per step."""
    args.max_num_seqs = num_running
    sched = build_scheduler(args, qualname,
                            {"policy": policy, "log_interval": 0} if policy else None)
    spec = TraceRequest(0.0, args.max_prompt, 100_000)
    for index in range(num_running + num_waiting):
        sched.add_request(make_request(index, spec, args, time.time()))
    while len(sched.running) < num_running or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
        step(sched)  # admit and prefill the running set
    times = []
    cpu_start = time.process_time()
    for _ in range(num_steps):
        start = time.perf_counter()
        step(sched)
        times.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu_start
    times.sort()
    return {"median_ms": 1e3 * times[len(times) // 2], "mean_ms": 1e3 * sum(times) / len(times),
            "cpu_ms": 1e3 * cpu / num_steps,  # the process's CPU time: steadier on a busy host
            "num_running": len(sched.running), "num_waiting": len(sched.waiting)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model directory (its config only)")
    p.add_argument("--trace", help="Azure-2023-style CSV (required unless --cost)")
    p.add_argument("--scheduler", choices=("vllm", "andante"), default="andante")
    p.add_argument("--policy", default="vllm", help="andante's policy (andante scheduler)")
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--max-prompt", type=int, default=1500)
    p.add_argument("--max-output", type=int, default=200)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--num-blocks", type=int, default=400)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-steps", type=int, default=20000)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--cost", nargs=3, type=int, metavar=("RUNNING", "WAITING", "STEPS"),
                   help="time the scheduler's own steps instead of replaying the trace")
    p.add_argument("--shared-prefix", type=int, default=0,
                   help="tokens every prompt shares at its start (prefix-cache hits)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    qualname = VLLM_SCHEDULER if args.scheduler == "vllm" else ANDANTE_SCHEDULER
    policy = args.policy if args.scheduler == "andante" else None
    if args.cost:
        print(json.dumps({"scheduler": args.scheduler, "policy": policy,
                          **step_cost(args, qualname, policy, *args.cost)}))
        return 0
    if not args.trace:
        print("--trace is required (unless --cost)", file=sys.stderr)
        return 2
    steps, _ = replay(args, qualname, policy)
    num_preempted = sum(len(s["preempted"]) for s in steps)
    print(json.dumps({"scheduler": args.scheduler, "num_steps": len(steps),
                      "num_preemptions": num_preempted, "steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
