"""Simulation jobs of the Ascendra experiment: one (setup, system, rate) point each.

A point simulates a Poisson workload on the system's cluster and judges every request
by Ascendra's goodput (§8.2): good when it meets its TTFT SLO and its mean TBT SLO.
Points run in parallel processes; each returns plain numbers.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from andante.metrics import RequestRecord, records_from_requests
from andante.metrics.latency import tpot, ttft
from andante.metrics.slo import is_good_by_slo, meets_tbt, meets_ttft
from andante.sim import build_simulator
from andante.workload import to_requests
from experiments.ascendra_setup import SETUPS, SYSTEMS, Setup, System

GOODPUT_TARGET = 0.9


@dataclass(frozen=True, slots=True)
class Job:
    setup: Setup
    system: System
    rate: float
    num_requests: int | None
    seed: int = 0
    slo_scale: float = 1.0
    duration: float | None = None
    drop_late: bool = False
    num_instances: int = 3

    @property
    def key(self) -> tuple[str, str, float, float, bool, int]:
        return (self.setup.key, self.system.key, self.rate, self.slo_scale, self.drop_late,
                self.num_instances)


@dataclass(slots=True)
class Outcome:
    key: tuple[str, str, float, float, bool, int]
    num_requests: int
    num_good: int
    num_ttft_ok: int
    num_tbt_ok: int
    num_dropped: int
    num_completed: int
    p99_ttft: float
    mean_tbt: float
    wall_seconds: float
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.num_good / self.num_requests if self.num_requests else math.nan

    @property
    def num_violated(self) -> int:
        """Served (completed) but outside the SLO."""
        return self.num_completed - self.num_good


def _counters(sim: Any) -> dict[str, Any]:
    router = sim.controller.router
    errors = [e for inst in sim.instances
              if (e := getattr(getattr(inst.engine.scheduler.policy, "perf_model", None),
                               "error", None)) is not None]
    return {
        "offloads": getattr(router, "num_offloads", 0),
        "ticketed": getattr(router, "num_ticketed", 0),
        "perf_error": max(errors) if errors else None,
        "busy": [round(inst.stats.busy_time, 2) for inst in sim.instances],
    }


def _judge(records: Sequence[RequestRecord]) -> dict[str, Any]:
    firsts = [v for r in records if (v := ttft(r)) is not None]
    gaps = [v for r in records if (v := tpot(r)) is not None]
    return {
        "num_good": sum(is_good_by_slo(r) for r in records),
        "num_ttft_ok": sum(r.is_completed and meets_ttft(r) for r in records),
        "num_tbt_ok": sum(r.is_completed and meets_tbt(r) for r in records),
        "num_dropped": sum(r.finish_reason == "abort" for r in records),
        "num_completed": sum(r.is_completed for r in records),
        "p99_ttft": float(np.percentile(firsts, 99)) if firsts else math.nan,
        "mean_tbt": float(np.mean(gaps)) if gaps else math.nan,
    }


def run_job(job: Job) -> Outcome:
    workload = job.setup.workload(job.rate, job.num_requests, job.seed, job.slo_scale,
                                  job.duration)
    spec = job.system.spec(job.setup, job.drop_late, job.num_instances)
    sim = build_simulator(spec)
    requests = to_requests(workload)
    started = time.perf_counter()
    sim.run(requests)
    wall = time.perf_counter() - started
    judged = _judge(records_from_requests(requests))
    return Outcome(job.key, len(requests), wall_seconds=wall, counters=_counters(sim),
                   **judged)


def run_jobs(jobs: Sequence[Job], workers: int | None = None) -> dict[tuple[Any, ...], Outcome]:
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    if workers <= 1 or len(jobs) <= 1:
        return {job.key: run_job(job) for job in jobs}
    ordered = sorted(jobs, key=lambda j: -j.rate * (j.num_requests or 1))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return {out.key: out for out in pool.map(run_job, ordered)}


def rate_at_target(rates: Sequence[float], goodputs: Sequence[float],
                   target: float = GOODPUT_TARGET) -> tuple[float, str]:
    """The highest rate with goodput >= target, interpolated between the last point above
    and the first below it; ("<" / ">=") when the curve never / always meets it."""
    points = [(r, g) for r, g in zip(rates, goodputs, strict=True) if not math.isnan(g)]
    if not points:
        return math.nan, ""
    if points[0][1] < target:
        return points[0][0], "<"
    for (r0, g0), (r1, g1) in zip(points, points[1:], strict=False):
        if g1 < target:
            return r0 + (r1 - r0) * (g0 - target) / (g0 - g1), ""
    return points[-1][0], ">="


def flood_capacity(setup: Setup, num_requests: int = 600, seed: int = 0,
                   system: System | None = None) -> float:
    """Requests/s the system's three instances (default: vLLM's) complete when everything
    is queued at once: its saturated throughput."""
    workload = setup.workload(10_000.0, num_requests, seed)
    sim = build_simulator((system or SYSTEMS[0]).spec(setup))
    requests = to_requests(workload)
    report = sim.run(requests)
    return len(requests) / max(report.end_time, 1e-9)


__all__ = ["SETUPS", "Job", "Outcome", "flood_capacity", "perf_model_trace", "rate_at_target",
           "run_job", "run_jobs"]


def perf_model_trace(setup: Setup, num_steps: int, seed: int,
                     noise: float = 0.05) -> dict[str, Any]:
    """§5.1 refit, checked: an `OnlinePerfModel` that starts from a plain roofline
    (C2 = 1, nothing else) observes steps whose "measured" time is the calibrated A100
    model's times log-normal noise; returns its recent error after each step."""
    from andante.perf.shape import BatchShape
    from andante.perf.specs import CostCoefficients
    from andante.policies.ascendra.perf import OnlinePerfModel
    from andante.sim.instances import build_cost_model
    from andante.sim.spec import ClusterSpec

    truth = build_cost_model(ClusterSpec(model=setup.model, hardware=setup.hardware))
    prior = truth.with_coefficients(CostCoefficients(c1=0.0, c2=1.0, c3=0.0, c4=0.0, c5=0.0))
    model = OnlinePerfModel(prior, refit_every=64, min_samples=32, tolerance=0.0)
    rng = np.random.default_rng(seed)
    steps, errors, fits = [], [], []
    for step in range(num_steps):
        decodes = int(rng.integers(0, 128))
        chunks = [(1, int(rng.integers(100, 4000))) for _ in range(decodes)]
        if decodes == 0 or rng.random() < 0.3:
            chunks.append((int(rng.integers(16, 2048)), 0))
        shape = BatchShape.of(chunks)
        measured = truth.step_time(shape) * float(rng.lognormal(0.0, noise))
        before = model.num_fits
        model.observe(shape, measured)
        if model.num_fits != before:
            fits.append(step)
        steps.append(step + 1)
        errors.append(model.error or 0.0)
    return {"steps": steps, "errors": errors, "fits": fits, "noise": noise,
            "prior_error": errors[min(30, len(errors) - 1)], "final_error": errors[-1],
            "fitted": model.cost_model.coefficients, "true": truth.coefficients}
