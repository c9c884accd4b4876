"""Simulation helpers of the FastServe experiment: one point of a curve, the highest rate
within an SLO, KV memory over time, and the share of time steps wait for swaps.

Per-token latency is FastServe §6.1's metric: a request's end-to-end latency divided by
its number of output tokens; the curves report its mean and 95th percentile.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from andante.engine.config import SchedulerConfig
from andante.engine.engine import Engine, StepOutput
from andante.engine.stats import SchedulerStats
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.sim import ClusterSpec, build_simulator
from andante.workload import RequestSpec, WorkloadConfig, build_workload, to_requests

HOST_KV_GIB_PER_GPU = 96.0  # the paper's p4d hosts: 1152 GB for 8 GPUs
MAX_CONTEXT = 2048  # OPT's context; the same cut for every model keeps workloads equal
VLLM_BASELINE = "vllm-v0"  # the paper's "vllm": vLLM's prefill-first iteration-level scheduler


@dataclass(frozen=True, slots=True)
class Setup:
    """One panel of Fig. 11/12: a model on some GPUs and the arrival rates swept."""

    key: str
    title: str
    model: str
    hardware: str
    tp: int
    pp: int
    max_num_seqs: int
    rates: tuple[float, ...]
    quick_rates: tuple[float, ...]
    workload: str = "sharegpt"  # or "skewed" (`skewed_mix`)

    def make_workload(self, rate: float, num_requests: int, seed: int) -> list[RequestSpec]:
        if self.workload == "skewed":
            return skewed_mix(rate, num_requests, seed)
        return sharegpt_poisson(rate, num_requests, seed)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    def cost_model(self) -> CostModel:
        """The whole model on `tp` GPUs (its decode iteration defines the SLO)."""
        return CostModel(get_model(self.model), get_hardware(self.hardware), tp=self.tp)

    def slo(self) -> float:
        """FastServe §6.1: 10x the latency of one decoding iteration (0.3 s in the paper)."""
        return 10.0 * self.cost_model().decode_time(1, 512)

    def spec(self, policy: str, options: dict[str, Any] | None = None) -> ClusterSpec:
        config = SchedulerConfig(max_num_seqs=self.max_num_seqs, max_model_len=MAX_CONTEXT,
                                 max_num_batched_tokens=MAX_CONTEXT)
        fastserve = policy.startswith("fastserve")
        return ClusterSpec(
            model=self.model, hardware=self.hardware, tp=self.tp, pp=self.pp,
            policy=VLLM_BASELINE if policy == "vllm" else policy,
            policy_options=dict(options or {}), scheduler=config,
            swap_space_gib=HOST_KV_GIB_PER_GPU if fastserve else 4.0,
            overlap_swaps=fastserve,  # FastServe's engine swaps on a separate stream
        )


def sharegpt_poisson(rate: float, num_requests: int, seed: int) -> list[RequestSpec]:
    return build_workload(WorkloadConfig(kind="poisson", rate=rate, num_requests=num_requests,
                                         lengths="sharegpt", max_context=MAX_CONTEXT,
                                         seed=seed))


def skewed_mix(rate: float, num_requests: int, seed: int) -> list[RequestSpec]:
    """Poisson arrivals of 80% short chats (prompt 16-199, output 4-39 tokens) and 20%
    long jobs (prompt 400-1199, output 300-599): many short jobs behind a few long ones,
    the situation of the paper's Alpaca runs where skip-join MLFQ gains most."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, num_requests))
    long = rng.random(num_requests) < 0.2
    prompts = np.where(long, rng.integers(400, 1200, num_requests),
                       rng.integers(16, 200, num_requests))
    outputs = np.where(long, rng.integers(300, 600, num_requests),
                       rng.integers(4, 40, num_requests))
    return [RequestSpec(float(t), int(p), int(o))
            for t, p, o in zip(times, prompts, outputs, strict=True)]


@dataclass(slots=True)
class Point:
    """One simulated run, summarized."""

    mean: float  # mean per-token latency, s/token
    p95: float
    num_finished: int
    wall_seconds: float
    swap_stall_share: float = 0.0  # of the busy time, steps waited for KV copies
    kv_trace: list[tuple[float, float, float]] = field(default_factory=list)


def per_token_latencies(requests: Sequence[Any]) -> np.ndarray:
    values = [(r.timeline.token_times[-1] - r.arrival_time) / len(r.timeline.token_times)
              for r in requests if r.timeline.token_times and r.is_finished]
    return np.asarray(values, dtype=float)


class _StallMeter:
    """A step observer: Σ step durations and Σ (duration - forward pass)."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.busy = 0.0
        self.stalled = 0.0

    def __call__(self, output: StepOutput, stats: SchedulerStats) -> None:
        batch, duration = output.batch, output.result.duration
        forward = self.cost.step_time(batch.shape()) if batch.requests else 0.0
        self.busy += duration
        self.stalled += max(0.0, duration - forward)


def run_point(spec: ClusterSpec, workload: Sequence[RequestSpec], trace_kv: bool = False,
              measure_stalls: bool = False) -> Point:
    """Simulate `workload` on `spec`; optionally sample KV use after every step."""
    sim = build_simulator(spec, decode_runs=not measure_stalls)
    meters: list[_StallMeter] = []
    trace: list[tuple[float, float, float]] = []
    for inst in sim.instances:
        engine = inst.engine
        if measure_stalls:  # per step: no decode runs
            meter = _StallMeter(engine.executor.cost_model)
            engine.add_observer(meter)
            meters.append(meter)
        if trace_kv:
            _trace_kv(engine, trace)
    requests = to_requests(workload)
    started = time.perf_counter()
    sim.run(requests)
    wall = time.perf_counter() - started
    ptl = per_token_latencies(requests)
    busy = sum(m.busy for m in meters)
    return Point(
        mean=float(ptl.mean()) if ptl.size else math.nan,
        p95=float(np.percentile(ptl, 95)) if ptl.size else math.nan,
        num_finished=int(ptl.size), wall_seconds=wall,
        swap_stall_share=sum(m.stalled for m in meters) / busy if busy else 0.0,
        kv_trace=trace,
    )


def _trace_kv(engine: Engine, trace: list[tuple[float, float, float]]) -> None:
    """After each step (or decode run), record (time, device GB, host GB) of KV cache
    in use."""
    cost = engine.executor.cost_model
    gb_per_block = engine.scheduler.kv.block_size * cost.kv_bytes_per_token / 1e9

    def observe(output: StepOutput, stats: SchedulerStats) -> None:
        trace.append((stats.time, (stats.num_blocks - stats.num_free_blocks) * gb_per_block,
                      (stats.num_host_blocks - stats.num_free_host_blocks) * gb_per_block))

    engine.add_observer(observe)


def max_rate_within(rates: Sequence[float], values: Sequence[float],
                    slo: float) -> tuple[float, str]:
    """The highest rate whose latency stays within `slo`, read off the curve by linear
    interpolation (as from the paper's plots). The flag is "" when the curve crosses the
    SLO inside the sweep, ">=" when it never does (a lower bound), "<" when even the
    lowest rate violates it."""
    if not rates:
        return math.nan, ""
    if not values[0] <= slo:
        return rates[0], "<"
    for (r0, v0), (r1, v1) in zip(zip(rates, values, strict=True),
                                  zip(rates[1:], values[1:], strict=True), strict=False):
        if not v1 <= slo:
            if not math.isfinite(v1):
                return r0, ""
            return r0 + (r1 - r0) * (slo - v0) / (v1 - v0), ""
    return rates[-1], ">="


def value_at(rates: Sequence[float], values: Sequence[float], rate: float) -> float:
    """The curve's value at `rate` (linear interpolation; NaN outside the sweep)."""
    if not rates or rate < rates[0] or rate > rates[-1]:
        return math.nan
    return float(np.interp(rate, rates, values))


def gamma_burst(num_requests: int, rate: float, cv: float, max_output: int,
                seed: int) -> list[RequestSpec]:
    """Fig. 8's workload: Gamma arrivals (rate, CV), ShareGPT prompts, short outputs."""
    specs = build_workload(WorkloadConfig(kind="gamma", rate=rate, cv=cv,
                                          num_requests=num_requests, lengths="sharegpt",
                                          max_context=MAX_CONTEXT, seed=seed))
    return [replace(s, output_len=min(s.output_len, max_output)) for s in specs]
