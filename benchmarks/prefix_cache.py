"""Automatic prefix caching: TTFT on the real engine with and without the cache, and the
simulator's hit rate against its analytic value. Prints ONE JSON line.

Real engine (the embedded SmolLM2-135M-Instruct, greedy, `vllm` policy): `--requests`
requests (default 16) share a `--system-tokens`-token system prompt (default 1,000) and
each ask their own short question. As in a running server, the system prompt has been
seen before: one warm-up request with it runs first on a fresh engine; then the
requests arrive together and each one's TTFT is taken (arrival to first token). Rounds
alternate cache on / off (a fresh engine each, one shared executor); the load average
is recorded with each round and the figures are medians over rounds of the per-round
mean and median TTFT.

Simulator: a conversation workload (`andante.workload.prefix.as_conversations`) run
with the default cluster; its prefix-cache hit rate vs the analytic rate of
`expected_hit_tokens` (turns far apart, so each finds its predecessor's blocks), and
the mean TTFT with the cache off for comparison.

    python benchmarks/prefix_cache.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any


def _load() -> float:
    return os.getloadavg()[0]


class RealEngine:
    """The embedded model behind one TorchExecutor; a fresh engine per round."""

    def __init__(self, args: argparse.Namespace) -> None:
        from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
        from andante.models import load_model, load_tokenizer

        self.args = args
        self.model = load_model(args.model, args.dtype)
        self.tokenizer = load_tokenizer(args.model)
        self.executor = TorchExecutor(self.model, TorchExecutorOptions(
            dtype=args.dtype, num_threads=args.threads, kv_cache_gib=args.kv_cache_gib,
            swap_space_gib=0.0))
        self.system = self._system_prompt(args.system_tokens)
        self.count = 0

    def _system_prompt(self, num_tokens: int) -> list[int]:
        text = " ".join(f"Rule {i}: answer briefly, politely and accurately." for i in
                        range(num_tokens))
        return self.tokenizer.encode(text)[:num_tokens]

    def _prompt(self, index: int) -> list[int]:
        question = f" Question {index}: what is {index} plus {index * 3}?"
        return self.system + self.tokenizer.encode(question)

    def round(self, enable: bool) -> dict[str, Any]:
        from andante.core import Request, SamplingParams
        from andante.llm import build_engine, run_to_completion
        from andante.policies import SchedulerConfig

        config = SchedulerConfig(max_model_len=self.executor.max_model_len,
                                 max_num_batched_tokens=self.args.max_num_batched_tokens,
                                 enable_prefix_caching=enable)
        engine = build_engine(self.executor, self._clock(), "vllm", config)
        params = SamplingParams(max_tokens=self.args.max_tokens, temperature=0.0,
                                ignore_eos=True)
        load_before = _load()
        self.count += 1
        engine.add_request(Request(f"warm{self.count}", self._prompt(-1), params,
                                   engine.clock.now()))
        run_to_completion(engine)
        requests = [Request(f"r{self.count}-{i}", self._prompt(i), params, engine.clock.now())
                    for i in range(self.args.requests)]
        for req in requests:
            engine.add_request(req)
        run_to_completion(engine)
        ttfts = [r.timeline.token_times[0] - r.arrival_time for r in requests]
        return {"mean_ttft_s": statistics.fmean(ttfts), "median_ttft_s": statistics.median(ttfts),
                "hit_tokens": engine.stats().prefix_cache_hits,
                "load": round((load_before + _load()) / 2, 2)}

    @staticmethod
    def _clock() -> Any:
        from andante.core.clock import MonotonicClock

        return MonotonicClock()


def real_engine(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    bench = RealEngine(args)
    startup = time.perf_counter() - started
    bench.round(True)  # warm-up of torch's kernels, not counted
    rounds: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for name, enable in (("on", True), ("off", False)):
            rounds[name].append(bench.round(enable))
    out: dict[str, Any] = {"prompt_tokens": len(bench._prompt(0)),
                           "system_tokens": len(bench.system), "requests": args.requests,
                           "startup_s": round(startup, 1)}
    for name, runs in rounds.items():
        out[name] = {
            "mean_ttft_s": round(statistics.median(r["mean_ttft_s"] for r in runs), 3),
            "median_ttft_s": round(statistics.median(r["median_ttft_s"] for r in runs), 3),
            "rounds_mean_ttft_s": [round(r["mean_ttft_s"], 3) for r in runs],
            "hit_tokens": runs[-1]["hit_tokens"], "load": [r["load"] for r in runs]}
    out["ttft_speedup_mean"] = round(out["off"]["mean_ttft_s"] / out["on"]["mean_ttft_s"], 2)
    out["ttft_speedup_median"] = round(
        out["off"]["median_ttft_s"] / out["on"]["median_ttft_s"], 2)
    return out


def simulator(args: argparse.Namespace) -> dict[str, Any]:
    import dataclasses

    from andante.engine.config import SchedulerConfig
    from andante.sim import ClusterSpec, simulate
    from andante.workload import WorkloadConfig, build_workload
    from andante.workload.prefix import expected_hit_tokens

    workload = build_workload(WorkloadConfig(
        kind="poisson", rate=args.sim_rate, num_requests=args.sim_requests,
        lengths="uniform:32:256:16:128", seed=0,
        prefix_sharing=f"conversation:{args.sim_conversations}", max_context=4096))
    spec = ClusterSpec()
    started = time.perf_counter()
    on = simulate(spec, workload).summary
    wall = time.perf_counter() - started
    off_spec = dataclasses.replace(spec, scheduler=SchedulerConfig(enable_prefix_caching=False))
    off = simulate(off_spec, workload).summary
    expected = expected_hit_tokens(workload, spec.scheduler.block_size)
    analytic = sum(expected) / sum(s.prompt_len for s in workload)
    return {"requests": len(workload), "conversations": args.sim_conversations,
            "hit_rate": round(on.prefix_cache_hit_rate, 4), "analytic_hit_rate": round(analytic, 4),
            "saved_prefill_tokens": on.saved_prefill_tokens,
            "analytic_saved_tokens": sum(expected),
            "mean_ttft_ms_on": round(on.ttft.mean * 1e3, 2),
            "mean_ttft_ms_off": round(off.ttft.mean * 1e3, 2), "wall_s": round(wall, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved on/off rounds")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--system-tokens", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=4, help="output tokens per request")
    p.add_argument("--model", help="model path (default: the embedded SmolLM2)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--kv-cache-gib", type=float, default=2.0)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--sim-requests", type=int, default=400)
    p.add_argument("--sim-conversations", type=int, default=8)
    p.add_argument("--sim-rate", type=float, default=0.5)
    p.add_argument("--skip-engine", action="store_true", help="simulator part only")
    args = p.parse_args()
    result: dict[str, Any] = {"benchmark": "prefix_cache",
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not args.skip_engine:
        result["engine"] = real_engine(args)
    result["simulator"] = simulator(args)
    result["loadavg_end"] = list(os.getloadavg())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
