"""QLM request completion time estimator accuracy (QLM §6, Fig. 17; issue #12: R² of
predicted vs observed waiting and completion times on W_B, paper ≈ 0.99 for waiting).

W_B (one Mistral-7B instance on a simulated A100-80G, at most 32 running, ShareGPT
lengths, 30% latency-sensitive) arrives as two bursts; the first trains the estimator's
output-length model and measured throughput Θ, the second is measured
(experiments.qlm_runs.estimator_accuracy). Prints one JSON line.

Run from the repo root: python benchmarks/qlm_estimator.py
"""

from __future__ import annotations

import argparse
import json
import os
import time

from experiments.qlm_runs import estimator_accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="per burst")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    started = time.perf_counter()
    runs = [estimator_accuracy(args.requests, seed) for seed in args.seeds]
    print(json.dumps({"benchmark": "qlm_estimator", "requests_per_burst": args.requests,
                      "runs": runs, "wall_s": round(time.perf_counter() - started, 1),
                      "loadavg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
