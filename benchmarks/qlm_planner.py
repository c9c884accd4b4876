"""QLM plan generator overhead (QLM §8.3 Fig. 19; issue #12's target: <= 100 ms for 100
groups on this CPU): solve time vs number of request groups and instances.

The groups come from the real pipeline: requests of three models (Mistral-7B,
Llama-3.1-8B, OPT-13B as the Vicuna-13B-class model, a popularity skew), interactive and
batch SLO classes, grouped by `form_groups` (δ = 4, average batch 8, so 32 requests per
group); instances alternate A10-24G and A100-80G, with one model on the device and one in
host memory; the RCT estimator runs on the catalog's cost models. Each configuration is
solved `--repeats` times with the same seed; we report the median wall (and CPU) time of
`solve_problem` (the MILP build + HiGHS + plan extraction) and of `build_problem` (the
estimator's sampling, once), the solver's status, whether the plan fell back to EDF, and the
objective (eq. 13) beside EDF's (`source` says whether the plan is the program's or
EDF's, kept when it scored better). Prints one JSON line.

Run from the repo root: python benchmarks/qlm_planner.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from andante.cluster.qlm import (
    CostModelTable,
    InstanceView,
    OutputLengthModel,
    PlannerOptions,
    QueuedRequest,
    RCTEstimator,
    build_problem,
    edf_queues,
    evaluate_queues,
    form_groups,
    solve_problem,
)
from andante.perf import catalog
from andante.perf.cost_model import CostModel

MODELS = {"mistral": "mistral-7b", "llama8b": "llama-3.1-8b", "vicuna13b": "opt-13b"}
POPULARITY = ("mistral", "mistral", "mistral", "llama8b", "vicuna13b")  # head and tail models
HARDWARE = ("a10-24g", "a100-80g")
AVG_BATCH, DELTA = 8, 4.0
GROUP_SIZE = int(AVG_BATCH * DELTA)
DEFAULTS = PlannerOptions()


def instances(count: int) -> tuple[list[InstanceView], dict]:
    views, costs = [], {}
    for k in range(count):
        hw = catalog.get_hardware(HARDWARE[k % 2])
        iid = f"{hw.name}-{k}"
        theta = {}
        for name, spec in MODELS.items():
            model = catalog.get_model(spec)
            if model.weight_bytes > hw.mem_capacity * 0.9:
                continue
            cm = CostModel(model, hw)
            costs[(iid, name)] = cm
            theta[name] = AVG_BATCH / cm.decode_time(AVG_BATCH, 1024)
        views.append(InstanceView(
            instance_id=iid, models_on_device=("mistral",), models_on_host=("llama8b",),
            token_capacity=100_000, throughput=theta, device_memory_bytes=int(hw.mem_capacity),
            host_link_bandwidth=hw.host_link_bandwidth, disk_bandwidth=2e9,
            avg_batch_size=AVG_BATCH))
    return views, costs


def requests(num_groups: int, num_instances: int) -> list[QueuedRequest]:
    """num_groups × 32 requests whose keys split into exactly num_groups groups."""
    drain_s = num_groups * GROUP_SIZE * 256 / (num_instances * 600.0)  # rough queue drain
    out = []
    for gi in range(num_groups):
        model = POPULARITY[gi % len(POPULARITY)]
        interactive = gi % 3 == 0
        slo = 60.0 + drain_s if interactive else 4.0 * (60.0 + drain_s)
        for r in range(GROUP_SIZE):
            out.append(QueuedRequest(
                f"q{gi}-{r}", model, "interactive" if interactive else "batch",
                arrival=gi * 0.1, deadline=gi * 0.1 + slo,
                num_prompt_tokens=200 + 400 * (gi % 2)))
    return out


def run(num_groups: int, num_instances: int, options: PlannerOptions, repeats: int) -> dict:
    views, costs = instances(num_instances)
    est = RCTEstimator(CostModelTable(costs), OutputLengthModel(prior_mean=256, prior_std=96),
                       {n: catalog.get_model(s).weight_bytes for n, s in MODELS.items()})
    groups = form_groups(requests(num_groups, num_instances), AVG_BATCH, DELTA,
                         mean_output_tokens=est.outputs.mean)
    t0, c0 = time.perf_counter(), time.process_time()
    problem = build_problem(groups, views, est, now=num_groups * 0.1, options=options)
    build_s, build_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    solve_s, cpu_s = [], []
    for _ in range(repeats):
        t1, c1 = time.perf_counter(), time.process_time()
        plan = solve_problem(problem, options)
        solve_s.append(time.perf_counter() - t1)
        cpu_s.append(time.process_time() - c1)
    edf = evaluate_queues(problem, edf_queues(problem), options)
    return {"groups": len(groups), "instances": num_instances,
            "solve_ms": round(1e3 * statistics.median(solve_s), 1),
            "solve_cpu_ms": round(1e3 * statistics.median(cpu_s), 1),
            "build_ms": round(1e3 * build_s, 1),
            "build_cpu_ms": round(1e3 * build_cpu_s, 1),
            "status": plan.status, "fallback": plan.fallback, "source": plan.source,
            "needs_capacity": plan.needs_capacity, "feasible": plan.feasible,
            "objective": round(plan.objective, 1), "edf_objective": round(edf.objective, 1),
            "edf_feasible": edf.feasible}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--instances", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--work-limit", type=int, default=DEFAULTS.work_limit,
                        help="HiGHS limit checks before it stops (deterministic budget)")
    parser.add_argument("--max-nodes", type=int, default=DEFAULTS.max_nodes)
    parser.add_argument("--time-limit", type=float, default=None,
                        help="opt-in wall-clock cap in s (plans then depend on load)")
    parser.add_argument("--horizon", type=int, default=DEFAULTS.horizon_groups,
                        help="groups the MILP orders; 0: the whole queue")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    options = PlannerOptions(num_samples=args.samples, time_limit_s=args.time_limit,
                             work_limit=args.work_limit, max_nodes=args.max_nodes,
                             horizon_groups=args.horizon or None)
    results = [run(n, g, options, args.repeats) for n in args.groups for g in args.instances]
    print(json.dumps({"benchmark": "qlm_planner", "time_limit_s": args.time_limit,
                      "work_limit": args.work_limit, "max_nodes": args.max_nodes,
                      "horizon_groups": options.horizon_groups,
                      "num_samples": args.samples, "repeats": args.repeats,
                      "results": results}))


if __name__ == "__main__":
    main()
