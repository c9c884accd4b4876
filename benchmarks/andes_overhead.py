"""Wall time of one `andes` scheduling decision with N queued and 256 running requests.

Prints one JSON line: {mode: {N: {"median": ms, "min": ms}}} (the minimum is the
figure to trust on a shared, loaded machine). "solve": a decision where the knapsack runs (selective
triggering forced: watermark 0, every step); "order": a decision between solver runs
(gain-per-block ordering of the queue); "dp": the solve with the Appendix C solver.
The requests have varied prompts, reading speeds and TTFT targets, and part of them
already streamed, so gains differ. Targets (issue 5): greedy <= 1 ms at 1,000 and
<= 10 ms at 10,000 requests.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from decision_timing import NoopExecutor, time_decisions  # same folder

from andante.core import ManualClock, Request, SamplingParams, SyntheticTokens
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import SchedulerConfig

NUM_RUNNING = 256
TDS = (3.3, 4.0, 4.8, 5.5, 6.5)



def _request(i: int, arrival: float, prompt: int) -> Request:
    return Request(
        request_id=f"r{i}", prompt_token_ids=SyntheticTokens(prompt),
        sampling=SamplingParams(max_tokens=100_000, ignore_eos=True), arrival_time=arrival,
        slo=SLO(ttft=max(prompt / 5000, 1.0), tds=TDS[i % len(TDS)]),
    )


def _engine(num_queued: int, options: dict[str, Any]) -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    config = SchedulerConfig(max_num_seqs=NUM_RUNNING, max_model_len=8192)
    # Memory for the running requests and a little more: the queue does not fit.
    engine = build_engine(NoopExecutor(cost, 40 * NUM_RUNNING + 64), clock, "andes",
                          config, options)
    for i in range(NUM_RUNNING):
        engine.add_request(_request(i, 0.0, 256 + 16 * (i % 32)))
    while engine.scheduler.num_running < NUM_RUNNING:
        engine.step()
    for step in range(60):  # some streaming history
        clock.advance_to(0.05 * step)
        engine.step()
    for i in range(num_queued):
        engine.add_request(_request(NUM_RUNNING + i, 3.0 + i * 1e-3, 64 + (37 * i) % 2000))
    return engine, clock


def measure(num_queued: int, options: dict[str, Any], repeats: int = 30) -> dict[str, float]:
    """Median and minimum milliseconds of the scheduler's `schedule()` (policy decision
    plus applying it); the step is then completed so state moves on."""
    engine, clock = _engine(num_queued, options)
    samples = time_decisions(engine, clock, repeats, 20.0, 0.03)
    return {"median": round(statistics.median(samples) * 1000.0, 3),
            "min": round(min(samples) * 1000.0, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--dp-sizes", default="1000")
    args = parser.parse_args()
    solve = {"watermark": 0.0, "solver_interval": 1}
    modes: dict[str, tuple[dict[str, Any], str]] = {
        "solve": (solve, args.sizes),
        "order": ({"watermark": 1.0, "pacer_aware": False}, args.sizes),
        "dp": ({**solve, "solver": "dp"}, args.dp_sizes),
    }
    out: dict[str, dict[str, dict[str, float]]] = {}
    for mode, (options, sizes) in modes.items():
        out[mode] = {n: measure(int(n), options) for n in sizes.split(",") if n}
    print(json.dumps({"benchmark": "andes_decision_ms", "running": NUM_RUNNING,
                      "results": out}))


if __name__ == "__main__":
    main()
