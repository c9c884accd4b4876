"""Runs of the QLM experiment: the systems compared, the workloads (W_A, W_B, W_C) and
one measured point (SLO attainment, throughput, model swaps).

Systems (QLM §8 "Experiment Setup"): `qlm` (the qlm router over `qlm-edf` engines: its
agents evict or swap out running requests for a new head group, per request by cost,
state swaps overlapped with compute as QLM's asynchronous copies are), `vllm` (FCFS
`vllm` engines behind round-robin), `edf` (`edf` engines behind round-robin: earliest
deadline first over requests) and
`shepherd` (static model placement, deadline-ordered static batches). A multi-model
instance without a swap-driving router swaps to the oldest waiting request's model when
its engine runs dry (andante.sim.simulator), the baselines' behaviour in the paper
("none of them consider the impact of model swapping").

Arrivals (QLM §8 "Workloads": the Azure traces and Poisson): `poisson` at the given rate,
or a shared Azure 2023 trace (`azure-conv`, `azure-code`) replayed from its own
timestamps, sped up or slowed down (`rate_scale`) so that its first `num_requests`
arrivals come at the given mean rate: the trace's burstiness is kept, its rate is the
experiment's. The queue size of a run is the number of requests that have arrived and
not yet been scheduled (in the global queue or an engine's waiting queue), over time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from andante.cluster.qlm import r_squared
from andante.cluster.qlm.router import QLMRouter
from andante.cluster.registry import make_router
from andante.core.request import Request
from andante.sim import ClusterSpec, SimRun, simulate
from andante.sim.setup import with_router
from andante.sim.spec import InstanceSpec
from andante.workload import WorkloadConfig, build_workload
from andante.workload.mixes import (
    BATCH_DEADLINE_S,
    LATENCY_DEADLINE_S,
    add_mega_prompts,
    assign_deadlines,
    format_model_mix,
    head_tail_weights,
)
from andante.workload.spec import RequestSpec
from andante.workload.traces import load_trace

SYSTEMS = ("qlm", "vllm", "edf", "shepherd")
MAX_CONTEXT = 4000  # prompt + output: Vicuna-13B's 4096-token context
QUICK_MODELS = ("mistral-7b", "llama-3.1-8b", "vicuna-13b", "phi-3-mini")
FULL_MODELS = (*QUICK_MODELS, "qwen2.5-14b", "opt-13b")
ARRIVALS = ("poisson", "azure-conv")
QUEUE_POINTS = 120  # samples of the queue size over a run


@dataclass(frozen=True, slots=True)
class Point:
    """One run: SLO attainment (deadline met, all requests), throughput (completed
    requests per second of makespan; refused ones do not count), model swaps, plus
    QLM's counters."""

    slo_attainment: float
    throughput: float
    num_finished: int
    num_swaps: int
    counters: dict[str, int]
    estimator_r2: float | None
    mean_queue: float = 0.0  # requests waiting to be scheduled, time-averaged
    queue: tuple[tuple[float, ...], tuple[int, ...]] = ((), ())  # (times, sizes)
    makespan: float = 0.0  # first arrival to the last finish, seconds
    load_seconds: float = 0.0  # model swaps' load time, summed over instances
    average_batch: float | None = None  # QLM's measured average running batch
    by_slo: tuple[tuple[float, float, int], ...] = ()  # (deadline s, attainment, requests)
    num_missed: int = 0  # requests that missed their deadline (or never finished)
    # of them, those never preempted whose execution (first scheduling to finish)
    # outlasted the deadline (a preempted one's span holds its time re-queued)
    num_missed_executing: int = 0

    def row(self) -> dict[str, Any]:
        return {"SLO attainment": self.slo_attainment, "throughput (req/s)": self.throughput,
                "model swaps": self.num_swaps}

    def measured(self) -> dict[str, Any]:
        """What the report's explanations are computed from."""
        c = self.counters
        return {"evictions": c.get("num_evictions", 0), "state swaps": c.get("num_state_swaps", 0),
                "load seconds": self.load_seconds, "makespan": self.makespan,
                "mean queue": self.mean_queue, "average batch": self.average_batch,
                "max groups": c.get("max_groups", 0), "planner": self.planner,
                "missed": self.num_missed, "missed executing": self.num_missed_executing,
                "head changes": {k: v for k, v in c.items() if k.startswith("head_")}}

    @property
    def planner(self) -> dict[str, int] | None:
        """QLM's plan generator in this run: invocations, plans made, EDF fallbacks."""
        c = self.counters
        if "planner_invocations" not in c:
            return None
        return {"invocations": c["planner_invocations"], "plans": c["planner_plans"],
                "fallbacks": c["planner_fallbacks"],
                "needs_capacity": c.get("num_needs_capacity", 0)}


def base_spec(models: Sequence[str], num_instances: int, hardware: str = "a100-80g"
              ) -> ClusterSpec:
    return ClusterSpec(model=models[0], hardware=hardware, num_instances=num_instances,
                       models=tuple(models))


def mixed_hardware(spec: ClusterSpec, num_a10: int) -> ClusterSpec:
    """`spec` with its first `num_a10` instances on A10-24G, the rest on A100-80G."""
    members = tuple(InstanceSpec(hardware="a10-24g" if i < num_a10 else "a100-80g")
                    for i in range(spec.num_instances))
    return dataclasses.replace(spec, instances=members)


def system_spec(spec: ClusterSpec, system: str, **qlm_options: Any) -> ClusterSpec:
    """`spec` as one of SYSTEMS runs it (`qlm_options`: the qlm router's knobs)."""
    if system == "qlm":  # its engines' policy and per-request preemption: the router's
        qlm = with_router(spec, "qlm")
        return dataclasses.replace(qlm, router_options=dict(qlm_options), overlap_swaps=True)
    router, policy = {"vllm": ("round-robin", "vllm"), "edf": ("round-robin", "edf"),
                      "shepherd": ("shepherd", "static-batch")}[system]
    return dataclasses.replace(with_router(spec, router), policy=policy)


def sharegpt(rate: float, num_requests: int, seed: int, arrivals: str = "poisson",
             model_mix: str | None = None) -> list[RequestSpec]:
    """ShareGPT lengths; Poisson arrivals or a trace's at mean `rate` (module note)."""
    cfg = WorkloadConfig(kind=arrivals, rate=rate, num_requests=num_requests,
                         lengths="sharegpt", max_context=MAX_CONTEXT, seed=seed,
                         model_mix=model_mix)
    if arrivals != "poisson":
        cfg = dataclasses.replace(cfg, rate_scale=rate / trace_rate(cfg))
    return build_workload(cfg)


def trace_rate(cfg: WorkloadConfig) -> float:
    """The mean request rate of the trace's first `cfg.num_requests` arrivals."""
    times = load_trace(cfg.trace_path(cfg.kind), 1.0, cfg.num_requests).arrival_times
    if len(times) < 2 or times[-1] <= times[0]:
        raise ValueError(f"trace {cfg.kind!r}: too few arrivals to measure its rate")
    return (len(times) - 1) / float(times[-1] - times[0])


def w_a(models: Sequence[str], tail_share: float, latency_share: float, rate: float,
        num_requests: int, seed: int, arrivals: str = "poisson") -> list[RequestSpec]:
    """W_A: the first model is the popular one, the others are tail models."""
    mix = format_model_mix(head_tail_weights(models, 1, tail_share))
    specs = sharegpt(rate, num_requests, seed, arrivals, mix)
    return assign_deadlines(specs, latency_share, seed)


def w_b(model: str, latency_share: float, rate: float, num_requests: int, seed: int,
        arrivals: str = "poisson") -> list[RequestSpec]:
    specs = sharegpt(rate, num_requests, seed, arrivals, format_model_mix({model: 1.0}))
    return assign_deadlines(specs, latency_share, seed)


def w_c(models: Sequence[str], mega_share: float, rate: float, num_requests: int,
        seed: int) -> list[RequestSpec]:
    return add_mega_prompts(w_a(models, 0.6, 0.2, rate, num_requests, seed), mega_share, seed)


LONG_PROMPT_LEN, LONG_OUTPUT_LEN = 256, 2000  # the eviction workload's batch requests


def w_evict(model: str, num_instances: int, batch_slots: int, latency_rate: float,
            num_latency: int, seed: int, latency_start: float = 5.0) -> list[RequestSpec]:
    """W_B behind a saturated batch, the setting where eviction acts (QLM §5, LSOs 2-3;
    Fig. 13): at t = 0, batch-SLO requests with long outputs (256 in, 2,000 out), as
    many as every instance has batch slots (`batch_slots`, its max_num_seqs), so the
    running batch frees a slot only when one of them finishes, minutes later; from
    `latency_start`, `num_latency` latency-sensitive ShareGPT requests arrive (Poisson,
    `latency_rate`) while it runs. Without eviction they wait for that drain."""
    batch = [RequestSpec(0.0, LONG_PROMPT_LEN, LONG_OUTPUT_LEN, model=model)
             for _ in range(num_instances * batch_slots)]
    latency = [dataclasses.replace(s, arrival_time=s.arrival_time + latency_start)
               for s in w_b(model, 1.0, latency_rate, num_latency, seed)]
    batch = assign_deadlines(batch, 0.0, seed, LATENCY_DEADLINE_S, BATCH_DEADLINE_S)
    return batch + latency


def queue_sizes(requests: Sequence[Request], end: float, points: int = QUEUE_POINTS
                ) -> tuple[np.ndarray, np.ndarray]:
    """(times, requests arrived and not yet scheduled at each) over [first arrival, end]."""
    arrived = np.sort([r.arrival_time for r in requests])
    started = np.sort([r.timeline.first_scheduled_time for r in requests
                       if r.timeline.first_scheduled_time is not None])
    times = np.linspace(arrived[0], max(end, arrived[0]), points)
    waiting = (np.searchsorted(arrived, times, side="right")
               - np.searchsorted(started, times, side="right"))
    return times, waiting


def run_point(spec: ClusterSpec, workload: Sequence[RequestSpec]) -> Point:
    router = make_router(spec.router, spec.router_options)
    run = simulate(spec, workload, router=router)
    return _point(run, router if isinstance(router, QLMRouter) else None)


def _point(run: SimRun, router: QLMRouter | None) -> Point:
    requests = run.requests
    done = [r for r in run.report.finished if r.timeline.finish_time is not None
            and r.num_output_tokens == r.sampling.max_tokens]  # not refused
    met = sum(1 for r in done if r.slo.deadline is not None
              and r.timeline.finish_time - r.arrival_time <= r.slo.deadline)
    start = min(r.arrival_time for r in requests)
    span = max(run.report.end_time - start, 1e-9)
    finished = len(done)
    times, waiting = queue_sizes([*run.report.finished, *run.report.unfinished],
                                 run.report.end_time)
    done_ids = {r.request_id for r in done}
    by_slo = []
    for deadline in sorted({r.slo.deadline for r in requests if r.slo.deadline is not None}):
        members = [r for r in requests if r.slo.deadline == deadline]
        on_time = sum(1 for r in members if r.request_id in done_ids
                      and r.timeline.finish_time - r.arrival_time <= deadline)
        by_slo.append((deadline, on_time / len(members), len(members)))
    return Point(met / len(requests), finished / span, finished,
                 len(run.report.model_swaps), run.report.router_counters,
                 None if router is None else estimator_r2(run, router),
                 float(waiting.mean()),
                 (tuple(times.round(3).tolist()), tuple(int(w) for w in waiting)),
                 span, sum(s.seconds for s in run.report.model_swaps),
                 None if router is None else router.speed.average_batch(), tuple(by_slo),
                 *_misses(requests))


def _misses(requests: Sequence[Request]) -> tuple[int, int]:
    """(requests that missed their deadline, of them those never preempted whose
    execution, first scheduling to finish, was longer than the deadline). A preempted
    request's span holds the time it waited re-queued, which its timeline does not
    record, so it is not counted."""
    missed = executing = 0
    for r in requests:
        deadline, t = r.slo.deadline, r.timeline
        if deadline is None:
            continue
        if t.finish_time is None or t.finish_time - r.arrival_time > deadline:
            missed += 1
            if (t.finish_time is not None and t.first_scheduled_time is not None
                    and not t.preemption_times
                    and t.finish_time - t.first_scheduled_time > deadline):
                executing += 1
    return missed, executing


def estimator_r2(run: SimRun, router: QLMRouter) -> float | None:
    """R² of the estimator's first prediction of each request's completion time (its
    group's, eq. 5; from arrival) against the observed one, over the requests it
    predicted."""
    predicted = router.counters.predicted
    pairs = [(predicted[r.request_id] - r.arrival_time, r.timeline.finish_time - r.arrival_time)
             for r in run.report.finished
             if r.request_id in predicted and r.timeline.finish_time is not None]
    if len(pairs) < 3:
        return None
    return r_squared([p for p, _ in pairs], [o for _, o in pairs])


def estimator_accuracy(num_requests: int, seed: int) -> dict[str, float | int]:
    """Fig. 3 / Fig. 17 setting: W_B (batch SLO only: no later arrival overtakes a
    request by deadline) as two bursts on one Mistral-7B instance (at most 32 running,
    so a queue forms); the first burst trains the estimator (output lengths, Θ
    measured), the second, all at one instant, is measured: R² of each request's first
    predicted start (W_q) and completion against the observed ones."""
    first = w_b("mistral-7b", 0.0, 2000.0, num_requests, seed)
    gap = 400.0
    second = [dataclasses.replace(s, arrival_time=gap)  # one queue, estimated at once
              for s in w_b("mistral-7b", 0.0, 2000.0, num_requests, seed + 1)]
    spec = system_spec(base_spec(("mistral-7b",), 1), "qlm", replan_interval=0.05)
    spec = dataclasses.replace(spec, scheduler=dataclasses.replace(spec.scheduler,
                                                                   max_num_seqs=32))
    router = make_router(spec.router, spec.router_options)
    assert isinstance(router, QLMRouter)
    run = simulate(spec, first + second, router=router)
    starts, done = router.counters.predicted_start, router.counters.predicted
    rows = [(starts[r.request_id], r.timeline.first_scheduled_time, done[r.request_id],
             r.timeline.finish_time) for r in run.report.finished
            if r.arrival_time >= gap and r.request_id in starts and r.request_id in done
            and r.timeline.first_scheduled_time is not None
            and r.timeline.finish_time is not None]
    return {"num_requests": len(rows),
            "r2_waiting": r_squared([r[0] for r in rows], [r[1] for r in rows]),
            "r2_completion": r_squared([r[2] for r in rows], [r[3] for r in rows]),
            "mean_predicted_s": float(np.mean([r[2] - gap for r in rows])) if rows else 0.0,
            "mean_observed_s": float(np.mean([r[3] - gap for r in rows])) if rows else 0.0}
