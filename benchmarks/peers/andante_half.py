"""andante's half of engine_vs_peers.py: the figures, and a torch.profiler of its steps.

The engine runs in-process through the real scheduler (`vllm` policy) and TorchExecutor,
driven the way the peers drive their own engines: a batch of prompts is added and run to
completion. The figures are taken exactly as the vLLM peer takes them (see
benchmarks/vllm_peer/vllm_offline_bench.py): prefill = wall time of a 256-token prompt
with max_tokens=1; decode step = engine time from the first to the last token of a
1 + 32-token generation / 32 (the wall-clock difference T(1 + 32) - T(1) is kept as a
cross-check); concurrent = 16 requests x (128 in, 64 out) submitted together, output
tokens / wall second.

`profile_steps` profiles single engine steps of the three kinds named by issue 15: a
256-token prefill, a batch-8 decode step and a 16-request mixed step (8 decodes + 8
fresh 128-token prompts), writing an operator table and a Chrome trace per step; then
the whole 16-concurrent run under cProfile (the Python side: scheduling, input
building, the forward pass, sampling, the scheduler's update), writing its table and
each phase's share of the run's time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import os
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from peer_paths import VLLM_BENCH_SCRIPT

#: vLLM's default max_num_batched_tokens for `LLM(...)` on a CPU (engine/arg_utils.py).
VLLM_CPU_STEP_TOKENS = 4096


class AndanteHalf:
    """The andante engine, driven like the peer drives `LLM.generate`."""

    def __init__(self, args: argparse.Namespace) -> None:
        from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
        from andante.llm import build_offline_engine
        from andante.models import load_model
        from andante.policies import SchedulerConfig

        started = time.perf_counter()
        self.model = load_model(args.andante_model, "bfloat16")
        # the thread probe measured now, not a choice cached under other load
        self.executor = executor = TorchExecutor(self.model, TorchExecutorOptions(
            num_threads=args.threads, kv_cache_gib=2.0, swap_space_gib=0.0,
            reprobe_threads=True,
            decode_attention_threads=getattr(args, "andante_attention_threads", "auto")))
        # like the vLLM peer's `LLM(...)`: its CPU default step budget for the LLM class
        # (4,096 tokens: the 16 concurrent prompts, 2,048 tokens, prefill in one step on
        # both) and prefix caching off (the prompts share no prefix anyway)
        self.config = config = SchedulerConfig(
            max_model_len=args.max_model_len,
            max_num_batched_tokens=max(VLLM_CPU_STEP_TOKENS, args.max_model_len),
            enable_prefix_caching=False)
        self.engine = build_offline_engine(self.model, "vllm", config, executor)
        self.startup_s = time.perf_counter() - started
        self.count = 0

    def add(self, prompts: list[list[int]], max_tokens: int) -> list[Any]:
        from andante.core import Request, SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        now = self.engine.clock.now()
        requests = []
        for prompt in prompts:
            self.count += 1
            requests.append(Request(f"b{self.count}", prompt, params, now))
            self.engine.add_request(requests[-1])
        return requests

    def timed(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, float]:
        """(wall seconds, engine seconds per step after the first token) of one batch."""
        from andante.llm import run_to_completion

        started = time.perf_counter()
        requests = self.add(prompts, max_tokens)
        run_to_completion(self.engine)
        elapsed = time.perf_counter() - started
        for req in requests:
            if len(req.output_token_ids) != max_tokens:
                raise RuntimeError(f"expected {max_tokens} tokens, got {req.num_output_tokens}")
        first = max(r.timeline.token_times[0] for r in requests)
        last = max(r.timeline.token_times[-1] for r in requests)
        return elapsed, (last - first) / max(1, max_tokens - 1)


def load_peer_module() -> Any:
    """The vLLM peer script as a module, for `synthetic_prompt` and `INDEX_BASE` (it
    imports vLLM only inside functions)."""
    spec = importlib.util.spec_from_file_location("vllm_offline_bench", VLLM_BENCH_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Prompts:
    """Fresh synthetic prompts per phase, the same ids every peer uses."""

    def __init__(self) -> None:
        self.peer = load_peer_module()
        self.next = dict(self.peer.INDEX_BASE)

    def __call__(self, phase: str, count: int, length: int) -> list[list[int]]:
        start = self.next[phase]
        self.next[phase] += count
        return [self.peer.synthetic_prompt(length, i) for i in range(start, start + count)]


def _warm_up(half: AndanteHalf, prompts: _Prompts, args: argparse.Namespace) -> None:
    half.timed(prompts("warmup", 1, args.prefill_len), 1)
    for b in (1, 8):
        half.timed(prompts("warmup", b, args.decode_ctx), 1 + args.decode_steps)
    half.timed(prompts("warmup", args.conc_requests, args.conc_prompt), args.conc_output)


def _decode(half: AndanteHalf, prompts: _Prompts, args: argparse.Namespace,
            batch: int) -> dict[str, Any]:
    engine, wall = [], []
    n = args.decode_steps
    for _ in range(args.repeats):
        first, _ = half.timed(prompts("decode", batch, args.decode_ctx), 1)
        full, step = half.timed(prompts("decode", batch, args.decode_ctx), 1 + n)
        engine.append(step)
        wall.append((full - first) / n)
    step = statistics.median(engine)
    return {"ms_per_step": round(step * 1e3, 2), "tok_s": round(batch / step, 1),
            "ms_per_step_all": [round(s * 1e3, 2) for s in engine],
            "ms_per_step_wall": round(statistics.median(wall) * 1e3, 2)}


def run_andante(args: argparse.Namespace) -> dict[str, Any]:
    """One round of andante's figures, in the peers' record format."""
    import torch

    half = AndanteHalf(args)
    prompts = _Prompts()
    _warm_up(half, prompts, args)
    prefill = [half.timed(prompts("prefill", 1, args.prefill_len), 1)[0]
               for _ in range(args.repeats)]
    decode = {f"b{b}": _decode(half, prompts, args, b) for b in (1, 8)}
    mixed = _mixed_prefill(half, prompts, args) if getattr(args, "prefill_lengths", 0) else None
    conc = [args.conc_requests * args.conc_output
            / half.timed(prompts("concurrent", args.conc_requests, args.conc_prompt),
                         args.conc_output)[0]
            for _ in range(max(1, (args.repeats + 1) // 2))]
    return {
        "engine": "andante", "model": half.model.name, "dtype": "bfloat16",
        "threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        "startup_s": round(half.startup_s, 2),
        "max_num_batched_tokens": half.config.max_num_batched_tokens,
        "prefix_caching": half.config.enable_prefix_caching,
        "parallel_min_tokens": half.executor.thread_choice.parallel_min_tokens,
        "thread_choice": half.executor.thread_choice.source,
        "thread_probe_ms": {str(b): list(t) for b, t in
                            half.executor.thread_choice.timings.items()},
        "prefill_ms": round(statistics.median(prefill) * 1e3, 1),
        "prefill_ms_all": [round(p * 1e3, 1) for p in prefill],
        "decode": decode,
        "concurrent": {"out_tok_s": round(statistics.median(conc), 1),
                       "out_tok_s_all": [round(c, 1) for c in conc]},
        "step_buckets": half.executor.runner.buckets is not None,
        "attention": {"decode_matmul": half.executor.inputs.decode_matmul,
                      "decode_native": half.executor.inputs.decode_native,
                      "prefill_matmul": half.executor.inputs.prefill_matmul,
                      "decode_us": half.executor.decode_path_us,
                      "prefill_us": half.executor.prefill_path_us,
                      "decode_one_thread_below": half.executor.inputs.decode_one_thread_below,
                      "decode_threads_us": {str(b): list(t) for b, t in
                                            half.executor.decode_threads_us.items()}},
        "warmup_s": round(half.executor.warmup.seconds, 2),
        "warmup_sizes": len(half.executor.warmup.sizes),
        **({"mixed_prefill": mixed} if mixed else {}),
    }


#: Prompt lengths of the mixed-size prefills (`--prefill-lengths`), as served prompts.
MIXED_PREFILL_RANGE = (32, 256)


def _mixed_prefill(half: AndanteHalf, prompts: _Prompts,
                   args: argparse.Namespace) -> dict[str, Any]:
    """Prefills of `args.prefill_lengths` lengths drawn uniformly from MIXED_PREFILL_RANGE
    (seeded), one each, as a server meets them: mostly sizes this process never ran
    (the step-size buckets' case, andante.perf.step_sizes). Wall ms per prefill."""
    import random

    rng = random.Random(args.prefill_lengths_seed)
    lengths = [rng.randint(*MIXED_PREFILL_RANGE) for _ in range(args.prefill_lengths)]
    times = [half.timed(prompts("prefill", 1, n), 1)[0] * 1e3 for n in lengths]
    return {"count": len(lengths), "range": list(MIXED_PREFILL_RANGE),
            "distinct_lengths": len(set(lengths)),
            "mean_ms": round(statistics.mean(times), 2),
            "median_ms": round(statistics.median(times), 2),
            "ms_all": [round(t, 1) for t in times], "lengths": lengths}


def _profiled_step(half: AndanteHalf, name: str, out_dir: Path) -> dict[str, Any]:
    """Profile the engine's next step; writes NAME.txt (operator table) and a trace."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        started = time.perf_counter()
        output = half.engine.step()
        elapsed = time.perf_counter() - started
    batch = output.batch
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    (out_dir / f"{name}.txt").write_text(table)
    prof.export_chrome_trace(str(out_dir / f"{name}.trace.json"))
    return {"step_ms": round(elapsed * 1e3, 2), "executor_ms": round(
        output.result.duration * 1e3, 2), "requests": len(batch.requests),
        "tokens": batch.num_tokens}


def _step_until(half: AndanteHalf, done: Any) -> None:
    while not done():
        half.engine.step()


def _drain(half: AndanteHalf) -> None:
    from andante.llm import run_to_completion

    run_to_completion(half.engine)


def profile_steps(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Profile a prefill step, a batch-8 decode step and a 16-request mixed step."""
    half = AndanteHalf(args)
    prompts = _Prompts()
    _warm_up(half, prompts, args)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps: dict[str, Any] = {}
    half.add(prompts("prefill", 1, args.prefill_len), 1)
    steps["prefill_256"] = _profiled_step(half, "prefill_256", out_dir)
    _drain(half)
    decoding = half.add(prompts("decode", 8, args.decode_ctx), 1 + args.decode_steps)
    _step_until(half, lambda: all(r.num_output_tokens >= 1 for r in decoding))
    steps["decode_b8"] = _profiled_step(half, "decode_b8", out_dir)
    _drain(half)
    mixed = half.add(prompts("concurrent", 8, args.conc_prompt), args.conc_output)
    _step_until(half, lambda: all(r.num_output_tokens >= 1 for r in mixed))
    half.add(prompts("concurrent", 8, args.conc_prompt), args.conc_output)
    steps["mixed_16"] = _profiled_step(half, "mixed_16", out_dir)
    _drain(half)
    concurrent = _python_profile(half, prompts("concurrent", args.conc_requests,
                                               args.conc_prompt), args.conc_output, out_dir)
    return {"benchmark": "engine_profile", "out_dir": str(out_dir), "steps": steps,
            "concurrent_python": concurrent}


#: The step loop's phases, as (file suffix, function name) in cProfile's table.
_PHASES = {"schedule": ("engine/scheduler.py", "schedule"),
           "inputs": ("exec/torch_inputs.py", "build"),
           "forward": ("exec/torch_model.py", "forward"),
           "sample": ("exec/torch_sampler.py", "sample"),
           "update": ("engine/scheduler.py", "update")}


def _python_profile(half: AndanteHalf, prompts: list[list[int]], max_tokens: int,
                    out_dir: Path) -> dict[str, Any]:
    """The concurrent run under cProfile: concurrent_16.cprofile.txt (top functions by
    own time) and each phase's cumulative seconds and share of the run."""
    from andante.llm import run_to_completion

    profiler = cProfile.Profile()
    half.add(prompts, max_tokens)
    started = time.perf_counter()
    profiler.enable()
    run_to_completion(half.engine)
    profiler.disable()
    elapsed = time.perf_counter() - started
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    (out_dir / "concurrent_16.cprofile.txt").write_text(text.getvalue())
    phases: dict[str, Any] = {}
    for name, (suffix, func) in _PHASES.items():
        cumulative = sum(row[3] for (path, _, fn), row in stats.stats.items()  # type: ignore[attr-defined]
                         if fn == func and path.endswith(suffix))
        phases[name] = {"s": round(cumulative, 3), "share": round(cumulative / elapsed, 3)}
    return {"wall_s": round(elapsed, 3), "phases": phases}
