"""Wall time of one `fastserve` decision under KV pressure (most jobs swapped out).

Unlike scheduler_overhead.py (ample KV: nothing to swap), the device here holds about
a tenth of the jobs, so every decision orders swaps by ENST. Prints one JSON line:
{policy: {"N": ms}} for N jobs in the system. Target (issue 6): <= 1 ms at 1,000.
"""

from __future__ import annotations

import argparse
import json
import statistics

from decision_timing import NoopExecutor, time_decisions  # same folder

from andante.core import ManualClock, Request, SamplingParams, SyntheticTokens
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import SchedulerConfig


def measure(policy: str, num_jobs: int, repeats: int = 30) -> float:
    clock = ManualClock()
    cost = CostModel(get_model("opt-13b"), get_hardware("a100-40g"))
    config = SchedulerConfig(max_num_seqs=256, max_model_len=2048,
                             max_num_batched_tokens=2048)
    num_blocks = max(64, num_jobs * 40 // 10)  # ~ a tenth of the jobs fit (640 tokens each)
    engine = build_engine(NoopExecutor(cost, num_blocks, 1_000_000), clock, policy, config)
    for i in range(num_jobs):
        engine.add_request(Request(
            request_id=f"r{i}", prompt_token_ids=SyntheticTokens(64 + (i * 37) % 1100),
            sampling=SamplingParams(max_tokens=100_000, ignore_eos=True), arrival_time=0.0))
    warm = 0
    while engine.scheduler.num_waiting and warm < 20 * num_jobs:  # everyone has run
        clock.advance_to(clock.now() + 0.03)
        engine.step()
        warm += 1
    samples = time_decisions(engine, clock, repeats, clock.now() + 0.03, 0.03)
    return statistics.median(samples) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="fastserve,fastserve-fcfs,vllm")
    parser.add_argument("--sizes", default="100,1000")
    args = parser.parse_args()
    out = {p: {n: round(measure(p, int(n)), 3) for n in args.sizes.split(",")}
           for p in args.policies.split(",")}
    print(json.dumps({"benchmark": "fastserve_decision_time_ms", "results": out}))


if __name__ == "__main__":
    main()
