"""Simulation runs of the Andes experiment: setups, jobs, probes, a process pool.

A `Job` is plain data (a cluster spec and a workload config), so jobs run in worker
processes; each returns an `Outcome` with the summary figures and, on request, the
per-request QoE/TTFT arrays and queue lengths over time. The probe observes the engine's
steps (the policy itself never reads a clock): it samples the queues and times the
steps in which Andes' knapsack ran.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from andante.engine.config import SchedulerConfig
from andante.engine.engine import StepOutput
from andante.engine.stats import SchedulerStats
from andante.metrics.latency import ttft
from andante.metrics.qoe import qoe_all
from andante.metrics.record import records_from_requests
from andante.metrics.summary import summarize
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload, to_requests

HARDWARE = "a100-40g"  # Andes §6.1: A100 SXM4 40GB in one p4d.24xlarge
VLLM_BASELINE = "vllm-v0"  # the paper's "vllm": vLLM v0.6's prefill-first FCFS (§6.1)


@dataclass(frozen=True, slots=True)
class Setup:
    key: str
    title: str
    model: str
    tp: int
    max_model_len: int
    cycle: float  # seconds of one burst cycle (the paper: 20 minutes)

    def spec(self, policy: str, options: dict[str, Any] | None = None) -> ClusterSpec:
        config = SchedulerConfig(max_model_len=self.max_model_len,
                                 max_num_batched_tokens=max(8192, self.max_model_len))
        policy = VLLM_BASELINE if policy == "vllm" else policy
        if policy == "andes":  # the paper's prefill-first steps unless told otherwise
            options = {"chunked_prefill": False, **(options or {})}
        return ClusterSpec(model=self.model, hardware=HARDWARE, tp=self.tp, policy=policy,
                           policy_options=dict(options or {}), scheduler=config)

    def workload(self, **kw: Any) -> WorkloadConfig:
        """ShareGPT lengths that fit the model's context, Andes' QoE parameters."""
        base = WorkloadConfig(kind="burst", num_requests=None, duration=self.cycle,
                              cycle_length=self.cycle, max_context=self.max_model_len)
        return replace(base, **kw)


PHI = Setup("phi3", "Phi-3-mini, 4xA100 (tp=4)", "phi-3-mini", 4, 4096, 600.0)
LLAMA = Setup("llama70b", "Llama-3.1-70B, 8xA100 (tp=8)", "llama-3.1-70b", 8, 8192, 1200.0)


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    spec: ClusterSpec
    workload: WorkloadConfig
    until: float | None = None  # stop a thrashing run (in-flight QoE is then judged)
    detail: bool = False  # keep per-request arrays and queue samples


@dataclass(slots=True)
class Outcome:
    key: str
    summary: dict[str, Any]
    num_requests: int
    solve_seconds: list[float] = field(default_factory=list)
    wall_seconds: float = 0.0
    qoe: np.ndarray | None = None
    ttft: np.ndarray | None = None
    queue: np.ndarray | None = None  # rows: time, waiting, running, swapped, kv usage
    peak_queue: int = 0  # the most waiting and swapped requests after any step (detail)
    prompts: np.ndarray | None = None  # prompt tokens per request (detail)

    @property
    def mean_qoe(self) -> float:
        return float(self.summary["mean_qoe"])


class Probe:
    """A step observer: queue samples, and the wall time of the steps in which Andes'
    knapsack ran (from the previous step's end: scheduling, the solve and applying the
    step; the solve dominates).

    Samples fall on a fixed grid (every `sample_every` simulated seconds), each taken at
    the end of the step that covers it (none while the engine idles): a simulator run
    of steps (andante.sim.decode_run) covers its grid points at once, and the waiting
    and swapped counts it reports are those of each of its steps (nobody is admitted
    or preempted within a run), so the queue samples do not depend on the fast paths
    (running requests and KV usage are the run's last step's). `peak_queue` is the
    most waiting and swapped requests after any step, exactly (a run's are its
    steps')."""

    def __init__(self, policy: Any, sample_every: float) -> None:
        self.policy_stats = getattr(policy, "stats", None)  # AndesStats (Andes only)
        self.num_solves = 0
        self.sample_every = sample_every
        self.num_grid_points = 0  # grid points passed (sampled, or idle)
        self.peak_queue = 0
        self.samples: list[tuple[float, int, int, int, float]] = []
        self.solve_seconds: list[float] = []
        self.last_step_end = time.perf_counter()

    def __call__(self, output: StepOutput, stats: SchedulerStats) -> None:
        now = time.perf_counter()
        solves = self.policy_stats.num_solves if self.policy_stats is not None else 0
        if solves != self.num_solves:
            self.num_solves = solves
            self.solve_seconds.append(now - self.last_step_end)
        if self.sample_every > 0:
            self.peak_queue = max(self.peak_queue, stats.num_waiting + stats.num_swapped)
            self._sample(stats, stats.time - output.result.duration)
        self.last_step_end = time.perf_counter()

    def _sample(self, stats: SchedulerStats, start: float) -> None:
        """The grid points in (start, stats.time]: the output's steps."""
        while (point := self.num_grid_points * self.sample_every) <= stats.time:
            self.num_grid_points += 1
            if point > start:
                self.samples.append((point, stats.num_waiting, stats.num_running,
                                     stats.num_swapped, stats.kv_usage))


def run_job(job: Job) -> Outcome:
    requests = to_requests(build_workload(job.workload))
    sim = build_simulator(job.spec)
    probes = [Probe(inst.engine.scheduler.policy, 5.0 if job.detail else 0.0)
              for inst in sim.instances]
    for inst, probe in zip(sim.instances, probes, strict=True):
        inst.engine.add_observer(probe)
    started = time.perf_counter()
    report = sim.run(requests, until=job.until)
    wall = time.perf_counter() - started
    records = records_from_requests(requests)
    first = min((r.arrival_time for r in requests), default=0.0)
    duration = max(report.end_time - first, 1e-9)
    summary = summarize(records, duration=duration, now=report.end_time).to_dict()
    out = Outcome(job.key, summary, len(requests), probes[0].solve_seconds, wall)
    if job.detail:
        out.qoe = np.array(qoe_all(records, report.end_time))
        out.ttft = np.array([v if (v := ttft(r)) is not None else np.nan for r in records])
        out.queue = np.array(probes[0].samples)
        out.peak_queue = probes[0].peak_queue
        out.prompts = np.array([r.num_prompt_tokens for r in records])
    return out


def run_jobs(jobs: Sequence[Job], workers: int | None = None) -> dict[str, Outcome]:
    """Run jobs (in parallel when there is more than one CPU); keyed by job key."""
    workers = workers or min(4, os.cpu_count() or 1)
    if workers <= 1 or len(jobs) <= 1:
        return {job.key: run_job(job) for job in jobs}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return {out.key: out for out in pool.map(run_job, jobs)}


def saturated_throughput(setup: Setup, seed: int, num_requests: int = 2000) -> float:
    """Requests/s vLLM completes when every request is already queued (flood)."""
    workload = setup.workload(kind="poisson", rate=1e4, num_requests=num_requests,
                              duration=None, seed=seed)
    out = run_job(Job("flood", setup.spec("vllm"), workload))
    return float(out.summary["request_throughput"])


def sustainable_rate(setup: Setup, seed: int, target: float = 0.95,
                     iterations: int = 5) -> tuple[float, float]:
    """(rate, saturated throughput): the highest Poisson rate at which vLLM keeps mean
    QoE >= target over one cycle, by bisection below the saturated throughput."""
    top = saturated_throughput(setup, seed)
    lo, hi = 0.2 * top, top
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        workload = setup.workload(kind="poisson", rate=mid, seed=seed)
        if run_job(Job("calibrate", setup.spec("vllm"), workload)).mean_qoe >= target:
            lo = mid
        else:
            hi = mid
    return lo, top
