"""Time one Vidur simulation and print one JSON line (run with the Vidur venv's python).

All arguments are passed to Vidur's own CLI parser (`python -m vidur.main` flags).
Vidur's `Simulator.run()` is the event loop followed by `_write_output()`; this wrapper
records when `_write_output` starts so the loop and the output phase are timed apart:

  startup_s  config parsing, execution-time predictor (train or load from cache),
             request generation, event-queue fill (`Simulator(config)`)
  loop_s     the discrete-event loop over all requests
  output_s   metrics CSV/plots/traces (whatever the metrics flags leave on)

requests_per_wall_s = num_requests / loop_s (the figure comparable to andante's
`sim_wall_s`); requests_per_wall_s_incl_output = num_requests / (loop_s + output_s).
Mean TTFT and E2E latency are read from the request objects after the loop (at no cost
to it), so they are there in every metrics mode.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time


def patch_restart() -> list[int]:
    """vidur 0.0.26 bug: Request.restart() (vLLM recompute preemption) leaves the
    per-stage counters `_num_stage_processed_tokens` / `_is_prefill_stage_complete`
    from the first attempt, so the first preempted request trips
    `assert self._num_stage_processed_tokens <= self.total_tokens`
    (vidur/entities/request.py, on_batch_stage_end). Reset them with the rest of the
    request state; also count restarts. Returns a one-element counter."""
    from vidur.entities.request import Request

    counter = [0]
    original = Request.restart

    def restart(self) -> None:  # type: ignore[no-untyped-def]
        original(self)
        self._num_stage_processed_tokens = 0
        self._is_prefill_stage_complete = False
        counter[0] += 1

    Request.restart = restart  # type: ignore[method-assign]
    return counter


def latency_means(requests: list) -> dict[str, float | None]:  # type: ignore[type-arg]
    """Mean TTFT (arrival to prefill end) and E2E latency of the completed requests, s."""
    done = [r for r in requests if r.completed]
    if not done:
        return {"mean_ttft_s": None, "mean_e2e_s": None}
    ttft = sum(r.prefill_completed_at - r.arrived_at for r in done) / len(done)
    e2e = sum(r.completed_at - r.arrived_at for r in done) / len(done)
    return {"mean_ttft_s": round(ttft, 4), "mean_e2e_s": round(e2e, 4)}


def main() -> None:
    t_import = time.perf_counter()
    from vidur.config import SimulationConfig
    from vidur.entities import Batch
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    logging.getLogger().setLevel(logging.WARNING)
    restarts = patch_restart()
    t0 = time.perf_counter()
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    sim = Simulator(config)
    t1 = time.perf_counter()

    marks: dict[str, float] = {}
    original_write_output = sim._write_output

    def timed_write_output() -> None:
        marks["loop_end"] = time.perf_counter()
        marks["loop_end_cpu"] = time.process_time()
        original_write_output()

    sim._write_output = timed_write_output  # type: ignore[method-assign]
    requests = [event._request for _, event in sim._event_queue]
    c1 = time.process_time()
    sim.run()
    t3 = time.perf_counter()
    c3 = time.process_time()
    t2 = marks["loop_end"]

    rg = config.request_generator_config
    n = len(requests)
    replica = config.cluster_config.replica_config
    sched = config.cluster_config.replica_scheduler_config
    # A synthetic generator has length and interval generators; trace replay has neither.
    ivl = (getattr(rg, "length_generator_config", rg),
           getattr(rg, "interval_generator_config", None))
    metrics = config.metrics_config
    store = sim.metric_store
    predictor_config = config.execution_time_predictor_config
    replica_scheduler = next(iter(sim.scheduler._replica_schedulers.values()))
    out = {
        "benchmark": "vidur_sim_speed",
        "vidur": __import__("importlib.metadata").metadata.version("vidur"),
        "num_requests": n,
        "completed": sum(1 for r in requests if r.completed),
        **latency_means(requests),
        "qps": getattr(ivl[1], "qps", None),
        "requests": type(rg).__name__,
        "lengths": type(ivl[0]).__name__,
        "length_file": getattr(ivl[0], "trace_file", None),
        "max_tokens": getattr(ivl[0], "max_tokens", None),
        "model": replica.model_name,
        "device": replica.device,
        "tp": replica.tensor_parallel_size,
        "pp": replica.num_pipeline_stages,
        "replicas": config.cluster_config.num_replicas,
        "scheduler": str(sched.get_type()),
        "batch_size_cap": sched.batch_size_cap,
        "predictor": str(predictor_config.get_type()),
        "native_predictor": predictor_config.use_native_execution_time_predictor,
        "write_metrics": metrics.write_metrics,
        "store_plots": metrics.store_plots,
        "chrome_trace": metrics.enable_chrome_trace,
        "simulated_seconds": round(sim._time, 3),
        "num_batches": Batch._id + 1,  # Vidur's global batch-id counter
        "num_restarts": restarts[0],
        "kv_blocks": replica_scheduler._cache_config.num_blocks,
        "import_s": round(t0 - t_import, 3),
        "startup_s": round(t1 - t0, 3),
        "loop_s": round(t2 - t1, 3),
        "output_s": round(t3 - t2, 3),
        "requests_per_wall_s": round(n / (t2 - t1), 1),
        "requests_per_wall_s_incl_output": round(n / (t3 - t1), 1),
        "loop_cpu_s": round(marks["loop_end_cpu"] - c1, 3),
        "requests_per_cpu_s": round(n / (marks["loop_end_cpu"] - c1), 1),
        "output_cpu_s": round(c3 - marks["loop_end_cpu"], 3),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    try:  # request-level sanity figures when metrics were collected
        import numpy as np

        if metrics.write_metrics:
            e2e = store._request_metrics_time_distributions  # type: ignore[attr-defined]
            for key, series in e2e.items():
                name = getattr(key, "value", str(key))
                if name in ("request_e2e_time", "request_scheduling_delay"):
                    vals = np.array(getattr(series, "_data_series", []))
                    if len(vals):
                        vals = vals[:, 1]
                        for q in (50, 90, 99):
                            out[f"{name}_p{q}_s"] = round(float(np.percentile(vals, q)), 3)
    except Exception as exc:  # metrics internals differ across versions; never fail the run
        out["metrics_note"] = f"request metrics not summarised: {type(exc).__name__}"
    print(json.dumps(out), flush=True)
    print(f"vidur output dir: {metrics.output_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
