"""Wall time of one scheduling decision with N waiting and 256 running requests.

Prints one JSON line: {policy: {"1000": ms, "10000": ms}}, for every registered policy
by default (`--policies all`; static-batch runs one batch of 16, not 256). Target
(issue 2): <= 1 ms at 1,000 waiting and <= 10 ms
at 10,000, with 256 running.
"""

from __future__ import annotations

import argparse
import json
import statistics

from decision_timing import NoopExecutor, time_decisions  # same folder

from andante.core import ManualClock, Request, SamplingParams, SyntheticTokens
from andante.core.sampling import SLO
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import SchedulerConfig, policy_names


def _request(i: int, arrival: float, prompt: int) -> Request:
    return Request(
        request_id=f"r{i}", prompt_token_ids=SyntheticTokens(prompt),
        sampling=SamplingParams(max_tokens=100_000, ignore_eos=True), arrival_time=arrival,
        priority=i % 4, slo=SLO(ttft=1.0, tds=4.8, deadline=30.0 + i % 7),
    )


def measure(policy: str, num_waiting: int, num_running: int = 256, repeats: int = 30) -> float:
    clock = ManualClock()
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    config = SchedulerConfig(max_num_seqs=num_running, max_model_len=8192)
    engine = build_engine(NoopExecutor(cost, 200_000, step_time=0.02), clock, policy, config)
    for i in range(num_running):  # admitted and prefilled first
        engine.add_request(_request(i, 0.0, 512))
    # until all run, or as many as the policy admits (static-batch: one batch)
    admitted = -1
    while admitted < engine.scheduler.num_running < num_running:
        admitted = engine.scheduler.num_running
        engine.step()
    for i in range(num_waiting):
        engine.add_request(_request(num_running + i, 1.0 + i * 1e-3, 64 + i % 900))
    samples = time_decisions(engine, clock, repeats, 2.0, 0.02)
    return statistics.median(samples) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="all",
                        help="comma-separated, or all (every registered policy)")
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    out: dict[str, dict[str, float]] = {}
    policies = policy_names() if args.policies == "all" else args.policies.split(",")
    for policy in policies:
        out[policy] = {n: round(measure(policy, int(n)), 3) for n in args.sizes.split(",")}
    print(json.dumps({"benchmark": "scheduler_overhead_ms", "running": 256, "results": out}))


if __name__ == "__main__":
    main()
