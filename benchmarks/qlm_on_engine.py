"""QLM on the real engine: several models behind `andante serve`, `qlm` vs round-robin.

    .venv/bin/python benchmarks/qlm_on_engine.py --rate 3 --duration 15 --seeds 0 1 2

The embedded model (SmolLM2-135M, CPU) is served under several names, each with its
own SLO class (a deadline from arrival to the last token), by `--instances` in-process
instances that swap models (warm, from host memory). Each system (`qlm`: the QLM router;
`vllm`: the vLLM policy per instance with round-robin routing over the instances holding
the model, swapping when none does) gets the same Poisson arrivals (same seed: same
models, prompt lengths and output lengths; token-id prompts, `ignore_eos`).

The default load is one where round-robin `vllm` misses SLOs on this CPU: three models
on two instances, so one model is never on a device and round-robin swaps whenever its
requests come. Each run is cut at `--max-run-s` (60 s): a request still open then
counts as missed (and its tokens are not counted). Seeds are interleaved (the order of
the systems alternates per seed) and the load average is recorded per run. Each run is
a fresh process (`--single SYSTEM`), so no run inherits another's memory or threads.

Prints ONE JSON line: per system and seed the SLO attainment (finished within its
deadline), the output throughput (tokens/s over the run), the swaps per minute, the mean
end-to-end latency per model; the medians over the seeds; and qlm's ratios to vllm (of
the medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from andante.server import EngineOptions, ServeOptions, ServerThread

# name -> (share of the requests, deadline in s): latency-sensitive, normal, batch
CLASSES = {"chat": (0.5, 6.0), "code": (0.3, 15.0), "batch": (0.2, 60.0)}
SYSTEMS = {"vllm": "round-robin", "qlm": "qlm"}


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    model: str
    prompt: list[int]
    max_tokens: int


def workload(rate: float, duration: float, seed: int) -> list[Arrival]:
    """Poisson arrivals; each picks a model by its share, a prompt of 16-96 token ids
    and an output of 8-32 tokens."""
    rng = random.Random(seed)
    names, shares = list(CLASSES), [share for share, _ in CLASSES.values()]
    out, now = [], rng.expovariate(rate)
    while now < duration:
        prompt = [rng.randrange(100, 20000) for _ in range(rng.randint(16, 96))]
        out.append(Arrival(now, rng.choices(names, shares)[0], prompt, rng.randint(8, 32)))
        now += rng.expovariate(rate)
    return out


Result = tuple[str, float, int]  # model, latency (s; inf: not answered), output tokens


async def _send(client: httpx.AsyncClient, start: float, arrival: Arrival) -> Result:
    await asyncio.sleep(max(0.0, start + arrival.at - time.monotonic()))
    sent = time.monotonic()
    deadline = CLASSES[arrival.model][1]
    reply = await client.post("/v1/completions", json={
        "model": arrival.model, "prompt": arrival.prompt, "max_tokens": arrival.max_tokens,
        "temperature": 0, "ignore_eos": True, "slo": {"deadline": deadline}})
    reply.raise_for_status()
    return arrival.model, time.monotonic() - sent, reply.json()["usage"]["completion_tokens"]


async def _drive(url: str, arrivals: list[Arrival], max_run_s: float
                 ) -> tuple[list[Result], float]:
    """Send every arrival on time; stop at `max_run_s` (the open requests: missed)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.monotonic()
        tasks = [asyncio.create_task(_send(client, start, a)) for a in arrivals]
        await asyncio.wait(tasks, timeout=max_run_s)
        makespan = time.monotonic() - start
        results = []
        for task, arrival in zip(tasks, arrivals, strict=True):
            if task.done():
                results.append(task.result())
            else:
                task.cancel()
                results.append((arrival.model, math.inf, 0))
        return results, makespan


def run_system(args: argparse.Namespace, router: str, arrivals: list[Arrival]) -> dict[str, Any]:
    options = ServeOptions(
        models=tuple((name, None) for name in CLASSES), router=router, port=0,
        instances=args.instances, log_level=args.log_level, max_queued=100_000,
        engine=EngineOptions(num_kv_blocks=args.num_kv_blocks, max_num_seqs=16,
                             num_threads=args.threads, max_model_len=512))
    with ServerThread(options) as server:
        load_average = os.getloadavg()[0]
        results, makespan = asyncio.run(_drive(server.url, arrivals, args.max_run_s))
        swaps = server.state.runner.num_model_swaps
        router = server.state.runner.controller.router
    counters = getattr(router, "counters", None)
    speed = getattr(router, "speed", None)
    met = sum(latency <= CLASSES[model][1] for model, latency, _ in results)
    done = [r for r in results if math.isfinite(r[1])]
    return {
        "num_requests": len(results),
        "slo_attainment": met / len(results),
        "output_throughput": sum(n for _, _, n in results) / makespan,
        "swaps_per_minute": swaps / (makespan / 60.0),
        "num_unanswered": sum(math.isinf(latency) for _, latency, _ in results),
        "mean_latency_s": {m: statistics.fmean(lat for mm, lat, _ in done if mm == m)
                           for m in CLASSES if any(mm == m for mm, _, _ in done)},
        "makespan_s": makespan,
        "load_average": load_average,
        "requests": [[a.model, round(a.at, 2), round(lat, 2), n]  # --single only
                     for a, (_, lat, n) in zip(arrivals, results, strict=True)],
        "router": {} if counters is None else counters.summary(),
        "learned_slowdown": {} if speed is None else speed.summary(),
    }


def _run_apart(args: argparse.Namespace, system: str, seed: int) -> dict[str, Any]:
    """One run in a fresh process (its result: the last line it prints)."""
    argv = [sys.executable, __file__, "--single", system, "--seeds", str(seed),
            "--rate", str(args.rate), "--duration", str(args.duration),
            "--max-run-s", str(args.max_run_s), "--instances", str(args.instances),
            "--threads", str(args.threads), "--num-kv-blocks", str(args.num_kv_blocks),
            "--log-level", args.log_level]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{system} seed {seed} failed ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result.pop("requests", None)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=3.0, help="requests/s (default 3)")
    p.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals")
    p.add_argument("--max-run-s", type=float, default=60.0,
                   help="cut each run here; open requests count as missed (default 60)")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per instance")
    p.add_argument("--num-kv-blocks", type=int, default=256)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--log-level", default="warning",
                   help="the server's log level (info: each swap and qlm's decisions)")
    p.add_argument("--single", choices=list(SYSTEMS),
                   help="run this system on the first seed only and print its result")
    args = p.parse_args()
    if args.single:
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                            format="%(relativeCreated)8.0f ms %(name)s: %(message)s")
        arrivals = workload(args.rate, args.duration, args.seeds[0])
        print(json.dumps(run_system(args, SYSTEMS[args.single], arrivals)))
        return
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    for k, seed in enumerate(args.seeds):  # interleaved: the order alternates per seed
        for name in list(SYSTEMS)[:: 1 if k % 2 == 0 else -1]:
            runs[name].append({"seed": seed, **_run_apart(args, name, seed)})
    keys = ("slo_attainment", "output_throughput", "swaps_per_minute")
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in keys}
               for name, rs in runs.items()}
    out: dict[str, Any] = {
        "benchmark": "qlm_on_engine", "rate": args.rate, "duration": args.duration,
        "max_run_s": args.max_run_s, "instances": args.instances, "seeds": args.seeds,
        "classes": {m: {"share": s, "deadline_s": d} for m, (s, d) in CLASSES.items()},
        "median": medians, "runs": runs,
        "qlm_over_vllm": {key: medians["qlm"][key] / medians["vllm"][key]
                          if medians["vllm"][key] else None
                          for key in ("slo_attainment", "output_throughput")}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
