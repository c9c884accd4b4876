"""KunServe drop-plan generation time vs cluster size (Figure 6's greedy, §4.1).

For N in 2..64 instances of Qwen-2.5-14B on A100-80G (the plan's memory arithmetic from
the cost model), every instance throttled with a random unmet demand, the demand set
so that the plan must merge every instance into pairs and then pairs into quads
(`--demand-share` of what merging all into pairs frees, default 1.5). Reports the
median and max over `--repeats` runs per N, in milliseconds. Prints one JSON line.
Target: <= 10 ms at 64 instances.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from andante.cluster.kunserve.plan import (
    GroupState,
    LayerMemory,
    balanced_slices,
    drop_plan,
)
from andante.cluster.kunserve.seam import GroupPlan
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel

SIZES = (2, 4, 8, 16, 32, 64)


def memory_of(model: str, hardware: str, block_size: int = 16) -> LayerMemory:
    cost = CostModel(get_model(model), get_hardware(hardware))
    spec, kv_token = cost.model, cost.kv_bytes_per_token_per_gpu
    num_blocks = cost.kv_capacity_tokens(0.9) // block_size
    return LayerMemory(
        num_layers=spec.num_layers,
        weight_bytes_per_layer=(spec.dense_params_per_layer + 2 * spec.hidden_size)
        * spec.dtype_bytes,
        kv_block_bytes_per_layer=block_size * kv_token // spec.num_layers,
        kv_region_bytes=num_blocks * block_size * kv_token)


def time_plan(num: int, memory: LayerMemory, share: float, rng: random.Random) -> float:
    pair = GroupPlan((0, 1), balanced_slices(2, memory.num_layers))
    per_pair = memory.group_blocks(pair) - 2 * memory.num_blocks_whole
    demand = int(share * per_pair * (num // 2))
    weights = [rng.random() for _ in range(num)]
    units = [GroupState(GroupPlan((i,), ((0, memory.num_layers),)),
                        int(demand * w / sum(weights))) for i, w in enumerate(weights)]
    started = time.perf_counter()
    drop_plan(units, demand, memory)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-14b")
    parser.add_argument("--hardware", default="a100-80g")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--demand-share", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    memory = memory_of(args.model, args.hardware)
    rng = random.Random(args.seed)
    results = {}
    for num in SIZES:
        times = [time_plan(num, memory, args.demand_share, rng) for _ in range(args.repeats)]
        results[str(num)] = {"median_ms": round(statistics.median(times), 4),
                             "max_ms": round(max(times), 4)}
    print(json.dumps({
        "benchmark": "kunserve_plan", "model": args.model, "hardware": args.hardware,
        "repeats": args.repeats, "plan_ms_by_instances": results,
        "target_ms_at_64": 10.0,
        "meets_target": results["64"]["median_ms"] <= 10.0,
    }))


if __name__ == "__main__":
    main()
