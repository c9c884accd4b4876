"""KunServe on the real engine: forming a 2-instance pipeline group and restoring it.

    .venv/bin/python benchmarks/kunserve_engine.py --rounds 3

Two in-process instances of the embedded model (SmolLM2-135M, bf16, CPU), each with a
small KV cache (`--kv-cache-gib`), serve `--requests` greedy requests each; once every
request has produced a few tokens the pair forms a group (instance 0 keeps layers
[0, L/2), instance 1 the rest: `andante.runtime.kunserve.LocalPipelineGroups`), serves a
few more tokens, and restores. Each round measures:
- form: wall time of `form_group` (the caller's view), the leader's step-boundary stall,
  and the time until the last KV chunk of the exchange arrived;
- restore: the weight reload done while the group served (`load_s`), the boundary stall,
  and the wall time of `dissolve_group`;
- bytes: KV moved between the instances (exchange, and back at restore), KV copied within
  one instance, weight bytes dropped at form and reloaded at restore;
- KV blocks: the leader's before and the group's after;
- whether every request's output equals an unsplit run's (greedy, token-identical).

Then (unless `--skip-burst`) the same two instances behind `andante serve`, each with a
KV cache of `--burst-kv-blocks` blocks, replay one cyclic burst (Andes' pattern:
`--rate` mean, `--burst-intensity` times that for `--burst-share` of each
`--cycle`-second cycle; streaming, token-id prompts, `ignore_eos`) under
`--router kunserve` (least-loaded dispatch plus KunServe's coordinator) and under
`least-loaded` with the vllm policy (the paper's vLLM baseline), rounds interleaved:
P50/P99 TTFT, P99 TPOT and output throughput per system, and kunserve's groups formed
and restored.

Then (unless `--skip-pipeline`) the decode throughput of one two-stage group run
pipelined (each stage on its own thread, microbatches in flight, each completing on its
own so that steps overlap: andante.exec.torch_microbatch, andante.engine.overlap)
against the same group run stage after stage on the same cores, rounds interleaved:
`pipelined_vs_sequential` is the median throughput ratio of the stage workers a served
group uses (`LocalGroupOptions.stage_workers`; `thread_ratio` and `process_ratio` are
both: stage threads, or stage processes, andante.exec.torch_pipeline_procs, whose
`process_cores` count the stage processes' CPU), with the bubble share of the
pipelined runs, with KunServe's lookahead cutting the microbatches and with plain row
cuts (`bubble_share_lookahead`, `bubble_share_rows`); `drained_ratio` is the same
pipeline draining at every step (`Engine.step`), as before steps overlapped. With
`--threads` above 1 each stage thread runs its share of them (`threads_per_stage`,
andante.exec.torch_microbatch's `stage_threads`); `shared_threads_ratio` is the
overlapped group with every stage thread on all `--threads` (as before), and each run's
process CPU per output token is reported beside its throughput. Why the ratio stays
below 1 here (measured, load 3.1-3.5, 1 thread, CPU ms per token, medians of 2):
sequential 16 requests 2.53, sequential 8 requests 3.34, overlapped 16 requests (two
microbatches of 8) 3.79, overlapped 32 requests (two of 16) 2.65. Decode streams the
weights once per microbatch, so cutting the same batch in two costs ~1.4x the CPU per
token; the pipeline wins only where it gets more than ~1.4x the cores the sequential
run gets, which a shared 2-core machine did not give it (0.5-1.0 cores measured). On this
machine both stages share 2 cores, so the overlap cannot add compute: the gain to show
here is in TTFT under pressure (the burst comparison), not in raw speed.

Prints ONE JSON line: per-round figures, their medians, and the load average of each
round (this machine is shared: figures are noisy).
"""

from __future__ import annotations

# ruff: noqa: E402 (the wait policy is set before anything imports torch)
import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from andante.exec.omp_wait import choose_wait_policy

choose_wait_policy(os.environ)  # as `andante serve` runs, before torch loads libgomp

import numpy as np
import torch

from andante.bench.load import BenchConfig, run_bench
from andante.cluster.kunserve.lookahead import fit_chunk_cost, lookahead_planner
from andante.cluster.kunserve.seam import GroupPlan
from andante.core import MonotonicClock, Request, SamplingParams
from andante.engine.overlap import OverlappedLoop
from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
from andante.exec.torch_microbatch import stage_threads
from andante.exec.torch_pipeline import (
    PipelineExecutor,
    StageWorkerKind,
    device_kv_bytes,
    pipeline_executor,
)
from andante.exec.torch_pipeline_procs import ProcessStageStream
from andante.llm import build_engine
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.policies import SchedulerConfig
from andante.runtime.kunserve import LocalGroupOptions, LocalPipelineGroups
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker
from andante.server import EngineOptions, ServeOptions, ServerThread
from andante.workload import RequestSpec
from andante.workload.arrivals import cyclic_burst

BURST_SYSTEMS = {"kunserve": "kunserve", "vllm": "least-loaded"}


def _wait(condition: Callable[[], bool], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark's requests did not progress")
        time.sleep(0.005)


def _requests(args: argparse.Namespace, prefix: str, vocab: int) -> list[Request]:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    return [Request(f"{prefix}{i}", [(7 * i + 13 * j) % (vocab - 200) + 100
                                     for j in range(args.prompt_len + 8 * i)], params,
                    time.monotonic()) for i in range(args.requests)]


def _instances(model: LoadedModel, options: TorchExecutorOptions,
               config: SchedulerConfig) -> list[LocalInstance]:
    clock = MonotonicClock()
    return [LocalInstance(InstanceWorker(i, build_engine(TorchExecutor(model, options), clock,
                                                         "vllm", config)))
            for i in range(2)]


def _reference(model: LoadedModel, options: TorchExecutorOptions, config: SchedulerConfig,
               requests: list[Request]) -> list[list[int]]:
    engine = build_engine(TorchExecutor(model, options), MonotonicClock(), "vllm", config)
    copies = [Request(r.request_id, list(r.prompt_token_ids), r.sampling, 0.0)
              for r in requests]
    for req in copies:
        engine.add_request(req)
    while engine.has_work:
        engine.step()
    return [list(r.output_token_ids) for r in copies]


def one_round(args: argparse.Namespace, model: LoadedModel, options: TorchExecutorOptions,
              config: SchedulerConfig, reference: list[list[int]]) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    instances = _instances(model, options, config)
    for inst in instances:
        inst.start(lambda _m: None, lambda _i, _e: None)
    try:
        requests = _requests(args, "r", model.config.vocab_size)
        half = len(requests) // 2
        for i, req in enumerate(requests):
            instances[0 if i < half else 1].submit(req)
        _wait(lambda: all(r.num_output_tokens >= args.tokens_before for r in requests))
        groups = LocalPipelineGroups(instances, LocalGroupOptions(
            exchange_bytes_per_step=args.exchange_mib << 20))
        layers = model.config.num_layers
        started = time.perf_counter()
        if not groups.form_group(GroupPlan((0, 1), ((0, layers // 2), (layers // 2, layers)))):
            raise RuntimeError("the group did not form")
        form_wall = time.perf_counter() - started
        form = groups.form_reports[-1]
        progress = [r.num_output_tokens for r in requests]
        _wait(lambda: form.exchange_seconds is not None and all(
            r.is_finished or r.num_output_tokens >= p + args.tokens_between
            for r, p in zip(requests, progress, strict=True)))
        started = time.perf_counter()
        if not groups.dissolve_group(0):
            raise RuntimeError("the group did not dissolve")
        restore_wall = time.perf_counter() - started
        restore = groups.restore_reports[-1]
        _wait(lambda: all(r.is_finished for r in requests))
    finally:
        for inst in instances:
            inst.stop()
    return {
        "form_s": form_wall, "form_prepare_s": form.prepare_seconds,
        "form_stall_s": form.seconds,
        "exchange_done_s": form.exchange_seconds,
        "restore_s": restore_wall, "restore_load_s": restore.load_seconds,
        "restore_stall_s": restore.seconds,
        "kv_bytes_exchanged": form.kv_bytes_exchanged, "kv_bytes_local_form": form.kv_bytes_local,
        "kv_bytes_back": restore.kv_bytes_back, "kv_bytes_local_restore": restore.kv_bytes_local,
        "weight_bytes_dropped": form.weight_bytes_dropped,
        "weight_bytes_reloaded": restore.weight_bytes_reloaded,
        "kv_blocks_before": form.kv_blocks_before[0],
        "kv_blocks_before_total": sum(form.kv_blocks_before.values()),
        "kv_blocks_after": form.kv_blocks_after,
        "num_adopted": form.num_adopted, "num_recomputed_at_restore": restore.num_recomputed,
        "num_token_identical": sum(list(r.output_token_ids) == ref
                                   for r, ref in zip(requests, reference, strict=True)),
        "loadavg_1m": [load_before, os.getloadavg()[0]],
    }


def burst_workload(args: argparse.Namespace) -> list[RequestSpec]:
    rng = np.random.default_rng(args.seed)
    times = cyclic_burst(args.rate, args.burst_intensity, args.burst_share, args.cycle,
                         None, rng, duration=args.duration)
    return [RequestSpec(float(t), int(rng.integers(args.prompt_len, 2 * args.prompt_len)),
                        int(rng.integers(args.max_tokens // 2, args.max_tokens + 1)))
            for t in times]


def burst_round(args: argparse.Namespace, system: str, specs: list[RequestSpec]
                ) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    options = ServeOptions(
        model=args.model, port=0, log_level="warning", instances=2,
        router=BURST_SYSTEMS[system], policy="vllm",
        router_options={} if system == "vllm" else {"restore_threshold": "0.5"},
        engine=EngineOptions(dtype=args.dtype, num_kv_blocks=args.burst_kv_blocks,
                             max_model_len=1024, swap_space_gib=0.0,
                             num_threads=args.threads))
    with ServerThread(options) as server:
        run = asyncio.run(run_bench(specs, BenchConfig(base_url=server.url, timeout=900)))
        operators = server.state.runner.controller.operators
        counters = operators[0].counters.summary() if operators else {}
    summary = run.summary.to_dict()
    return {"system": system, "num_errors": len(run.errors),
            "num_finished": summary["num_finished"], "duration_s": summary["duration"],
            "p50_ttft_s": (summary["median_ttft_ms"] or 0) / 1000,
            "p99_ttft_s": (summary["p99_ttft_ms"] or 0) / 1000,
            "p99_tpot_s": (summary["p99_tpot_ms"] or 0) / 1000,
            "output_throughput": summary["output_throughput"],
            "groups_formed": counters.get("num_drops", 0),
            "groups_restored": counters.get("num_restores", 0),
            "loadavg_1m": [load_before, os.getloadavg()[0]]}


def burst_comparison(args: argparse.Namespace) -> dict[str, Any]:
    specs = burst_workload(args)
    rounds = [burst_round(args, system, specs)
              for _ in range(args.burst_rounds) for system in BURST_SYSTEMS]
    medians = {system: _medians([r for r in rounds if r["system"] == system])
               for system in BURST_SYSTEMS}
    kun, base = medians["kunserve"], medians["vllm"]
    return {"num_requests": len(specs), "kv_blocks_per_instance": args.burst_kv_blocks,
            "median": medians,
            "p99_ttft_vllm_over_kunserve": base["p99_ttft_s"] / max(kun["p99_ttft_s"], 1e-9),
            "throughput_kunserve_over_vllm":
                kun["output_throughput"] / max(base["output_throughput"], 1e-9),
            "rounds": rounds}


def _medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in rounds[0].items() if isinstance(v, (int, float))
            and not isinstance(v, bool)]
    return {k: statistics.median(r[k] for r in rounds) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model path (default: embedded)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-cache-gib", type=float, default=0.05)
    parser.add_argument("--requests", type=int, default=6, help="requests in all")
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tokens-before", type=int, default=4,
                        help="output tokens every request has before the group forms")
    parser.add_argument("--tokens-between", type=int, default=4,
                        help="more output tokens each produces before the restore")
    parser.add_argument("--exchange-mib", type=int, default=8,
                        help="KV MiB copied between two steps of the group")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="bfloat16 GEMMs round differently with the batch size, so "
                             "outputs may differ from the unsplit run's once the group "
                             "batches both instances' requests together; float32 does not")
    parser.add_argument("--skip-form", action="store_true",
                        help="skip the form/restore rounds")
    parser.add_argument("--skip-burst", action="store_true",
                        help="skip the kunserve-vs-vllm burst comparison")
    parser.add_argument("--burst-rounds", type=int, default=1)
    parser.add_argument("--burst-kv-blocks", type=int, default=40,
                        help="KV blocks (16 tokens) per instance in the burst comparison")
    parser.add_argument("--rate", type=float, default=0.6, help="mean requests/s")
    parser.add_argument("--burst-intensity", type=float, default=4.0)
    parser.add_argument("--burst-share", type=float, default=0.2)
    parser.add_argument("--cycle", type=float, default=10.0, help="seconds per cycle")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-pipeline", action="store_true",
                        help="skip the pipelined-vs-sequential decode comparison")
    parser.add_argument("--pipeline-rounds", type=int, default=3)
    parser.add_argument("--pipeline-requests", type=int, default=16)
    parser.add_argument("--skip-process", action="store_true",
                        help="skip the stage-process runs of the pipeline comparison")
    args = parser.parse_args()
    out: dict[str, Any] = {"benchmark": "kunserve_engine", "dtype": args.dtype}
    if not args.skip_pipeline:
        out.update(pipelined_vs_sequential(args))
    if not args.skip_form:
        out["form_restore"] = form_restore(args)
    if not args.skip_burst:
        out["burst"] = burst_comparison(args)
    print(json.dumps(out))


def form_restore(args: argparse.Namespace) -> dict[str, Any]:
    model = load_model(args.model, args.dtype)
    options = TorchExecutorOptions(dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
                                   swap_space_gib=0.0, num_threads=args.threads)
    config = SchedulerConfig(max_model_len=1024, max_num_batched_tokens=1024)
    reference = _reference(model, options, config,
                           _requests(args, "r", model.config.vocab_size))
    rounds = [one_round(args, model, options, config, reference) for _ in range(args.rounds)]
    return {"model": model.name, "kv_cache_gib": args.kv_cache_gib, "requests": args.requests,
            "median": _medians(rounds), "rounds": rounds}


def _stage_cpu_seconds(group: PipelineExecutor) -> float:
    """CPU seconds the group's stage processes used so far (0 with thread stages)."""
    stream = group._stream
    if not isinstance(stream, ProcessStageStream):
        return 0.0
    total = 0.0
    for proc in stream._procs:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _group_decode(model: LoadedModel, options: TorchExecutorOptions, args: argparse.Namespace,
                  mode: str, lookahead: bool, stage_workers: StageWorkerKind = "thread",
                  threads_per_stage: int | None = None, first_on_caller: bool = False
                  ) -> tuple[float, float | None, list[list[int]], float]:
    """Output tokens/s of one two-stage group decoding `--pipeline-requests` requests,
    its bubble share (pipelined only), the outputs, and the cores it got (process CPU
    seconds per wall second while decoding: at most 1 sequential, 2 pipelined). `mode`:
    "sequential" (stage after stage), "drained" (microbatches in flight, the pipeline
    drains at every step: `Engine.step`) or "overlapped" (each microbatch completes on its
    own, the next step enters stage 0 meanwhile: andante.engine.overlap).
    `threads_per_stage`: the stage threads' intra-op threads (None: the executor's
    share per stage, 0: the executor's whole count each, as before stage threads took
    a share)."""
    # (the unsplit executor only sizes the group: its step warm-up is not needed)
    unsplit = TorchExecutor(model, dataclasses.replace(options, warmup_tokens=None))
    half = model.config.num_layers // 2
    kv = device_kv_bytes(unsplit.kv.num_device_blocks, model, options)
    planner = lookahead_planner(fit_chunk_cost(unsplit.cost_model)) \
        if lookahead else None
    pipelined = mode != "sequential"
    group = pipeline_executor(model, options, [(0, half), (half, model.config.num_layers)],
                              [kv, kv], unsplit.cost_model, unsplit.max_model_len, 0,
                              pipelined, planner, stage_workers=stage_workers)
    group.threads_per_stage = threads_per_stage
    group.first_stage_on_caller = first_on_caller
    del unsplit
    config = SchedulerConfig(max_model_len=1024, max_num_batched_tokens=1024)
    engine = build_engine(group, MonotonicClock(), "vllm", config)
    loop = OverlappedLoop(engine, group) if mode == "overlapped" else None
    step: Callable[[], object] = loop.step if loop is not None else engine.step
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    vocab = model.config.vocab_size
    requests = [Request(f"p{i}", [(11 * i + 5 * j) % (vocab - 200) + 100
                                  for j in range(args.prompt_len)], params, 0.0)
                for i in range(args.pipeline_requests)]
    for req in requests:
        engine.add_request(req)
    while any(r.num_output_tokens == 0 for r in requests):  # prefill, not timed
        step()
    made = sum(r.num_output_tokens for r in requests)
    started, cpu_started = time.perf_counter(), time.process_time() + _stage_cpu_seconds(group)
    while engine.has_work or (loop is not None and loop.has_work):
        step()
    seconds = time.perf_counter() - started
    cpu = time.process_time() + _stage_cpu_seconds(group) - cpu_started
    cores = cpu / seconds
    group.close()
    tokens = sum(r.num_output_tokens for r in requests) - made
    return tokens / seconds, group.pipeline_times.bubble_share if pipelined else None, \
        [list(r.output_token_ids) for r in requests], cores


def pipelined_vs_sequential(args: argparse.Namespace) -> dict[str, Any]:
    model = load_model(args.model, args.dtype)
    # resolved here, once, as an executor resolves an unset count: every group below is
    # built from these options, so the stage threads reported are the ones they run
    options = TorchExecutorOptions(dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
                                   swap_space_gib=0.0,
                                   num_threads=args.threads or torch.get_num_threads())
    assert options.num_threads is not None
    rounds = []
    for _ in range(args.pipeline_rounds):  # interleaved
        load = os.getloadavg()[0]
        seq, _, seq_out, seq_cores = _group_decode(model, options, args, "sequential", False)
        pipe, bubble, pipe_out, pipe_cores = _group_decode(model, options, args,
                                                           "overlapped", True)
        procs, bubble_procs, procs_out, procs_cores = _group_decode(
            model, options, args, "overlapped", True, "process") \
            if not args.skip_process else (float("nan"), None, seq_out, float("nan"))
        inline, bubble_inline, inline_out, inline_cores = _group_decode(
            model, options, args, "overlapped", True, first_on_caller=True)
        shared, _, shared_out, shared_cores = _group_decode(
            model, options, args, "overlapped", True, threads_per_stage=0) \
            if options.num_threads > 1 else (pipe, None, pipe_out, pipe_cores)
        rows, bubble_rows, rows_out, _ = _group_decode(model, options, args, "overlapped",
                                                       False)
        drained, bubble_drained, drained_out, _ = _group_decode(model, options, args,
                                                                "drained", True)
        rounds.append({"sequential_tok_s": seq, "pipelined_tok_s": pipe,
                       "process_tok_s": procs, "process_ratio": procs / seq,
                       "bubble_share_process": bubble_procs, "process_cores": procs_cores,
                       "pipelined_rows_tok_s": rows, "drained_tok_s": drained,
                       "ratio": pipe / seq, "drained_ratio": drained / seq,
                       "bubble_share_lookahead": bubble, "bubble_share_rows": bubble_rows,
                       "bubble_share_drained": bubble_drained,
                       "sequential_cores": seq_cores, "pipelined_cores": pipe_cores,
                       "threads_per_stage": stage_threads(options.num_threads, 2),
                       "sequential_cpu_ms_per_token": 1000 * seq_cores / seq,
                       "pipelined_cpu_ms_per_token": 1000 * pipe_cores / pipe,
                       "stage0_on_caller_ratio": inline / seq,
                       "stage0_on_caller_cpu_ms_per_token": 1000 * inline_cores / inline,
                       "bubble_share_stage0_on_caller": bubble_inline,
                       "shared_threads_ratio": shared / seq,
                       "shared_threads_cpu_ms_per_token": 1000 * shared_cores / shared,
                       "identical": seq_out == pipe_out == rows_out == drained_out
                       == procs_out == shared_out == inline_out,
                       "load_avg": load})
    median = _medians(rounds)
    chosen = LocalGroupOptions().stage_workers  # what a served group runs on
    ratio_key, bubble_key = ("process_ratio", "bubble_share_process") \
        if chosen == "process" else ("ratio", "bubble_share_lookahead")
    return {"pipelined_vs_sequential": median[ratio_key], "stage_workers": chosen,
            "thread_ratio": median["ratio"], "process_ratio": median["process_ratio"],
            "bubble_share": median[bubble_key],
            "pipeline": {"requests": args.pipeline_requests, "median": median,
                         "all_identical": all(r["identical"] for r in rounds),
                         "rounds": rounds}}


if __name__ == "__main__":
    main()
