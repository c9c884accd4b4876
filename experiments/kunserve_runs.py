"""Systems, workloads and runs of the KunServe experiment (see experiments/kunserve.py).

Systems (KunServe §5.1's baselines on one simulated cluster, the same engine):
- `vllm`: vLLM's loop, recompute on KV exhaustion, least-loaded dispatch;
- `vllm-pp`: the same GPUs as static two-stage pipelines (half the instances, `pp=2`);
- `infercept`: swap to host instead of recompute, copies overlapped with compute
  (InferCept's swap pipelining), 64 GiB of host KV per GPU;
- `llumnix`: `--router llumnix` (andante.cluster.llumnix): least-loaded dispatch,
  running requests' KV migrated from the least to the most free instance (freeness);
- `kunserve`: `--router kunserve` (drop, coordinated exchange, lookahead, restore).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from andante.cluster.controller import Controller
from andante.cluster.kunserve.plan import balanced_slices, layer_memory
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.clock import ManualClock
from andante.core.request import PreemptionMode, Request
from andante.engine.config import SchedulerConfig
from andante.sim.instances import build_cost_model, build_instance
from andante.sim.setup import build_simulator
from andante.sim.spec import ClusterSpec
from andante.workload.arrivals import cyclic_burst
from andante.workload.builder import resolve_traces_dir
from andante.workload.spec import RequestSpec, to_requests
from andante.workload.traces import load_trace

SYSTEMS = ("vllm", "vllm-pp", "infercept", "llumnix", "kunserve")
MEMORY_FULL = 0.9  # share of the KV blocks in use from which queueing is memory-bound
SEQS_FULL = 0.95  # share of the serving units' max_num_seqs from which it is batch-bound
AZURE_CODE = Path("azure_llm_2023") / "AzureLLMInferenceTrace_code.csv"


def traces_dir() -> Path:
    """The shared traces ($ANDANTE_TRACES, else ../shared/traces beside the checkout)."""
    return resolve_traces_dir(None)


def base_spec(model: str, hardware: str, tp: int, num_instances: int) -> ClusterSpec:
    return ClusterSpec(
        model=model, hardware=hardware, tp=tp, num_instances=num_instances,
        router="least-loaded",
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256,
                                  max_model_len=16384))


def system_spec(spec: ClusterSpec, system: str, **kun_options: Any) -> ClusterSpec:
    if system == "vllm":
        return spec
    if system == "vllm-pp":
        return dataclasses.replace(spec, pp=2, num_instances=max(1, spec.num_instances // 2))
    if system == "infercept":
        return dataclasses.replace(
            spec, swap_space_gib=64.0, overlap_swaps=True,
            scheduler=dataclasses.replace(spec.scheduler,
                                          preemption_mode=PreemptionMode.SWAP))
    if system == "llumnix":
        return dataclasses.replace(spec, router="llumnix")
    if system == "kunserve":
        return dataclasses.replace(spec, router="kunserve", router_options=dict(kun_options))
    raise ValueError(f"unknown system {system!r}; choose one of {SYSTEMS}")


# ---- workloads ---------------------------------------------------------------------
# Conversation-like lengths (lognormal): prompts of mean ~590 tokens, answers of mean
# ~1020. A request holds ~1100 tokens of KV for its whole decode (~70 s), so KV memory
# fills (at ~210 sequences on a 14B A100 instance) before vLLM's 256-sequence budget, and
# prefill needs little compute per KV token-second: bursts are memory-bound, not
# compute-bound (KunServe §2.2). Long prompts with short answers (the Azure code trace's
# own lengths) saturate prefill compute first, where dropping layers cannot help.
PROMPT_LOGNORMAL = (6.2, 0.6)
OUTPUT_LOGNORMAL = (6.75, 0.6)
TARGET_MEAN_DEMAND = 0.45  # mean KV demand / cluster KV capacity (the issue: < 0.6)
BURSTGPT_CV = 2.0  # gap coefficient of variation of the BurstGPT-shaped arrivals


@dataclass(frozen=True, slots=True)
class Lengths:
    """Lognormal (mu, sigma) of prompt and output lengths, and their caps."""

    prompt: tuple[float, float] = PROMPT_LOGNORMAL
    output: tuple[float, float] = OUTPUT_LOGNORMAL
    max_output: int = 2000

    def scaled_output(self, factor: float) -> Lengths:
        """Answers `factor` x longer (KV held longer per prefilled token: memory binds
        before prefill compute sooner)."""
        mu, sigma = self.output
        return Lengths(self.prompt, (mu + math.log(factor), sigma),
                       int(self.max_output * factor))


CHAT = Lengths()


def lognormal_mean(params: tuple[float, float]) -> float:
    mu, sigma = params
    return float(math.exp(mu + sigma * sigma / 2))


def _lengths(num: int, rng: np.random.Generator, lengths: Lengths = CHAT
             ) -> tuple[np.ndarray, np.ndarray]:
    prompts = np.clip(rng.lognormal(*lengths.prompt, num), 32, 8000).astype(int)
    outputs = np.clip(rng.lognormal(*lengths.output, num), 8, lengths.max_output).astype(int)
    return prompts, outputs


@dataclass(frozen=True, slots=True)
class DemandScaling:
    """Little's law on KV memory: the mean rate whose KV demand is `share` of capacity."""

    capacity_tokens: int  # KV tokens of the whole cluster
    kv_bytes_per_token: int  # one instance, all its GPUs
    mean_prompt: float
    mean_output: float
    tpot_s: float  # decode step time at the target batch
    kv_token_seconds: float  # per request: mean resident tokens x residency
    rate: float  # req/s of the whole cluster

    def as_text(self, share: float) -> str:
        return (f"KV per token {self.kv_bytes_per_token / 1024:.0f} KiB/instance; capacity "
                f"{self.capacity_tokens} tokens; request: prompt {self.mean_prompt:.0f} + "
                f"output {self.mean_output:.0f} tokens, resident {self.mean_output:.0f} x "
                f"{1000 * self.tpot_s:.1f} ms, mean {self.mean_prompt + self.mean_output / 2:.0f}"
                f" tokens -> {self.kv_token_seconds:.0f} token-s; rate = {share} x capacity / "
                f"token-s = {self.rate:.2f} req/s")


def demand_scaling(spec: ClusterSpec, share: float = TARGET_MEAN_DEMAND,
                   lengths: Lengths = CHAT) -> DemandScaling:
    """The mean arrival rate at which the average KV demand is `share` of the cluster's
    KV capacity: rate x (output x TPOT) x (prompt + output/2) = share x capacity tokens,
    TPOT from the cost model: the decode step at the batch that demand implies, stretched
    by the share of time the instance spends prefilling the arriving prompts."""
    cost = build_cost_model(spec)
    per_instance = build_instance(spec, 0, ManualClock()).engine.scheduler.kv.num_device_blocks
    capacity = per_instance * spec.scheduler.block_size * spec.num_instances
    prompt, output = lognormal_mean(lengths.prompt), lognormal_mean(lengths.output)
    resident = prompt + output / 2
    batch = max(1, int(share * capacity / spec.num_instances / resident))
    decode = cost.decode_time(batch, int(resident))
    prefill_per_token = cost.prefill_time(2048) / 2048
    tpot, rate = decode, 0.0
    for _ in range(20):  # fixed point: prefill chunks share the steps with decodes
        rate = share * capacity / (output * tpot * resident)
        busy = min(0.9, rate / spec.num_instances * prompt * prefill_per_token)
        tpot = decode / (1 - busy)
    return DemandScaling(capacity, cost.kv_bytes_per_token, prompt, output, tpot,
                         output * tpot * resident, rate)


def cyclic(rate: float, duration: float, seed: int, intensity: float = 4.0,
           share: float = 0.2, cycle: float = 120.0, lengths: Lengths = CHAT,
           cv: float = 1.0) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    times = cyclic_burst(rate, intensity, share, cycle, None, rng, duration=duration, cv=cv)
    prompts, outputs = _lengths(len(times), rng, lengths)
    return [RequestSpec(float(t), int(p), int(o)) for t, p, o in zip(times, prompts, outputs,
                                                                     strict=True)]


BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def burstgpt_shaped(path: Path, rate: float, duration: float, seed: int,
                    intensity: float, share: float, cycle: float,
                    lengths: Lengths = CHAT) -> list[RequestSpec]:
    """A BurstGPT-shaped trace: cyclic bursts (`intensity` x the mean `rate` over `share`
    of each `cycle`) whose gaps are Gamma (cv `BURSTGPT_CV`, as BurstGPT measured of
    ChatGPT's arrivals), written to `path` in BurstGPT's columns and replayed through the
    simulator's own trace reader (`andante.workload.traces.load_trace`)."""
    specs = cyclic(rate, duration, seed, intensity, share, cycle, lengths, cv=BURSTGPT_CV)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        out.write(BURSTGPT_HEADER)
        for s in specs:
            out.write(f"{s.arrival_time:.6f},ChatGPT,{s.prompt_len},{s.output_len},"
                      f"{s.prompt_len + s.output_len},Conversation log\n")
    trace = load_trace(path)
    return [RequestSpec(float(t), int(p), int(o)) for t, p, o in zip(
        trace.arrival_times, trace.prompt_lens, trace.output_lens, strict=True)]


def azure_bursts(rate: float, duration: float, seed: int) -> list[RequestSpec] | None:
    """The Azure 2023 code trace's arrival pattern (bursty), rate-scaled to `rate`
    req/s on average, with the chat lengths above; None without the trace."""
    path = traces_dir() / AZURE_CODE
    if not path.exists():
        return None
    trace = load_trace(path)
    scale = rate / (len(trace) / max(trace.span, 1e-9))
    scaled = load_trace(path, rate_scale=scale, max_duration=duration)
    rng = np.random.default_rng(seed)
    prompts, outputs = _lengths(len(scaled.arrival_times), rng)
    return [RequestSpec(float(t), int(p), int(o))
            for t, p, o in zip(scaled.arrival_times, prompts, outputs, strict=True)]


def extreme(rate: float, duration: float, seed: int) -> list[RequestSpec]:
    """One burst that never ends: a Poisson stream far above capacity."""
    return cyclic(rate, duration, seed, intensity=1.0, share=1.0, cycle=duration)


# ---- runs --------------------------------------------------------------------------
@dataclass(slots=True)
class MemorySampler:
    """A cluster operator sampling the KV blocks in use (and capacity) each second, the
    queued and running requests and the sequence budgets (a grouped member's pool is
    left out: its group's leader counts the group's blocks)."""

    every: float = 1.0
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # queued requests at each sample
    running: list[int] = field(default_factory=list)  # running requests of alive units
    seq_caps: list[int] = field(default_factory=list)  # their max_num_seqs, summed
    queued_blocks: list[int] = field(default_factory=list)  # KV blocks the queues need
    block_size: int = 16  # for the prompts waiting in the router's queue

    def after_step(self, controller: Controller) -> None:
        # a KunServe group's member keeps its own pool, unused, while grouped: the group's
        # blocks (its leader's) already count it, with the dropped weights' memory
        stats = [s.instance.load().stats for s in controller.slots
                 if not getattr(s.instance, "is_member", False)]
        now = max(s.time for s in stats)
        if self.samples and now - self.samples[-1][0] < self.every:
            return
        used = sum(s.num_blocks - s.num_free_blocks for s in stats)
        self.samples.append((now, used, sum(s.num_blocks for s in stats)))
        self.waiting.append(sum(s.num_waiting for s in stats) + len(controller.queue))
        routed = sum(-(-r.num_prompt_tokens // self.block_size) for r in controller.queue)
        self.queued_blocks.append(sum(s.num_queued_kv_blocks for s in stats) + routed)
        units = [s.instance.load().stats for s in controller.slots if s.alive]
        self.running.append(sum(s.num_running for s in units))
        self.seq_caps.append(sum(s.max_num_seqs for s in units))


@dataclass(slots=True)
class RunResult:
    system: str
    ttft: list[float]  # per request (inf: never started)
    tpot: list[float]
    arrivals: list[float]
    memory: list[tuple[float, int, int]]
    counters: dict[str, int]
    end_time: float
    num_unfinished: int
    waiting: list[int] = field(default_factory=list)  # aligned with `memory`
    group_lifetimes: list[float] = field(default_factory=list)  # seconds, formed->restored
    groups_alive_at_end: int = 0
    running: list[int] = field(default_factory=list)  # aligned with `memory`
    seq_caps: list[int] = field(default_factory=list)  # aligned with `memory`
    queued_blocks: list[int] = field(default_factory=list)  # aligned with `memory`
    headroom: dict[int, float] = field(default_factory=dict)  # see `drop_headroom`

    def peak_demand(self) -> float:
        """The most KV demanded at once (blocks in use plus the blocks the queued
        requests' uncomputed tokens need, the instances' queues and the router's), over
        the cluster's blocks without drop (the first sample's)."""
        base = self.memory[0][2] if self.memory else 0
        demand = [u + q for (_, u, _), q in zip(self.memory, self.queued_blocks, strict=False)]
        return max(demand, default=0) / base if base else math.nan

    def percentile(self, metric: str, q: float) -> float:
        values = [v for v in getattr(self, metric) if math.isfinite(v)]
        return float(np.percentile(values, q)) if values else math.nan

    def queued_seconds(self, full: float = MEMORY_FULL) -> tuple[float, float]:
        """Seconds (sampled) during which requests queued with the cluster's KV at least
        `full` in use (memory binds), and with KV to spare (compute or the batch binds)."""
        bound = self.bound_seconds(full)
        return bound["memory"], bound["sequences"] + bound["compute"]

    def bound_seconds(self, full: float = MEMORY_FULL, seqs_full: float = SEQS_FULL
                      ) -> dict[str, float]:
        """Seconds (sampled) during which requests queued, by what bound them then: the
        KV at least `full` in use ("memory"), else the alive units' running requests at
        least `seqs_full` of their max_num_seqs ("sequences"), else "compute" (prefill
        compute, or requests not yet admitted for any other reason)."""
        out = {"memory": 0.0, "sequences": 0.0, "compute": 0.0}
        for k in range(1, len(self.memory)):
            t, used, total = self.memory[k]
            if k >= len(self.waiting) or not self.waiting[k]:
                continue
            span = t - self.memory[k - 1][0]
            if total and used >= full * total:
                out["memory"] += span
            elif k < len(self.running) and self.seq_caps[k] \
                    and self.running[k] >= seqs_full * self.seq_caps[k]:
                out["sequences"] += span
            else:
                out["compute"] += span
        return out


def run_system(spec: ClusterSpec, workload: Sequence[RequestSpec], system: str,
        until: float | None = None) -> RunResult:
    sim = build_simulator(spec)
    sampler = MemorySampler(block_size=spec.scheduler.block_size)
    sim.controller.operators.append(sampler)
    requests = to_requests(workload)
    report = sim.run(requests, until=until)
    lifetimes, alive = _group_lifetimes(sim.controller.router, report.end_time)
    return RunResult(system, [_ttft(r) for r in requests], [_tpot(r) for r in requests],
                     [r.arrival_time for r in requests], sampler.samples,
                     dict(report.router_counters), report.end_time, len(report.unfinished),
                     sampler.waiting, lifetimes, alive, sampler.running, sampler.seq_caps,
                     sampler.queued_blocks,
                     drop_headroom(spec) if spec.router == "kunserve" else {})


def drop_headroom(spec: ClusterSpec) -> dict[int, float]:
    """KV blocks of a KunServe group of k instances over k undropped instances', for
    k = 2 .. the cluster's instances (andante.cluster.kunserve.plan's `LayerMemory`):
    the most a drop can hold, against the peak demand (`RunResult.peak_demand`)."""
    inst = build_instance(spec, 0, ManualClock())
    blocks = inst.engine.scheduler.kv.num_device_blocks
    memory = layer_memory(build_cost_model(spec), blocks, spec.scheduler.block_size)
    return {k: memory.group_blocks(GroupPlan(tuple(range(k)), balanced_slices(
        k, memory.num_layers))) / (k * blocks) for k in range(2, spec.num_instances + 1)}


def _group_lifetimes(router: object, end: float) -> tuple[list[float], int]:
    """Each KunServe group's life (formation to restore or failure; a group merged into
    a larger one ends there, a shrink does not end it; one alive at the end lives to
    `end`), and how many were alive at the end."""
    groups = getattr(getattr(router, "counters", None), "groups", None)
    events = getattr(groups, "events", None)
    if not events:
        return [], 0
    born: dict[int, float] = {}
    lives: list[float] = []
    for event in events:
        if event.kind == "shrink":  # the group lives on, one member fewer
            continue
        for index in event.members:
            if index in born:
                lives.append(event.time - born.pop(index))
        if event.kind == "form":
            born[event.members[0]] = event.time
    alive = len(born)
    lives += [end - t for t in born.values()]
    return lives, alive


def _ttft(req: Request) -> float:
    times = req.timeline.token_times
    return times[0] - req.arrival_time if times else math.inf


def _tpot(req: Request) -> float:
    times = req.timeline.token_times
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else math.nan


def slo_violations(results: Sequence[RunResult], scales: Sequence[float]
                   ) -> dict[str, list[float]]:
    """Share of requests whose TTFT or TPOT exceeds scale x the best baseline's P50
    (KunServe §5.2's SLO scale)."""
    ttft50 = min(r.percentile("ttft", 50) for r in results)
    tpot50 = min(r.percentile("tpot", 50) for r in results)
    out: dict[str, list[float]] = {}
    for r in results:
        shares = []
        for scale in scales:
            bad = sum(1 for t, p in zip(r.ttft, r.tpot, strict=True)
                      if t > scale * ttft50 or (math.isfinite(p) and p > scale * tpot50))
            shares.append(bad / len(r.ttft) if r.ttft else 0.0)
        out[r.system] = shares
    return out


def slo_causes(results: Sequence[RunResult], scale: float) -> dict[str, tuple[float, float]]:
    """Per system at SLO `scale`: the share of requests over the TTFT SLO, and the share
    within it but over the TPOT SLO (what makes `slo_violations`' share)."""
    ttft50 = min(r.percentile("ttft", 50) for r in results)
    tpot50 = min(r.percentile("tpot", 50) for r in results)
    out: dict[str, tuple[float, float]] = {}
    for r in results:
        late = sum(1 for t in r.ttft if t > scale * ttft50)
        slow = sum(1 for t, p in zip(r.ttft, r.tpot, strict=True)
                   if t <= scale * ttft50 and math.isfinite(p) and p > scale * tpot50)
        n = max(1, len(r.ttft))
        out[r.system] = (late / n, slow / n)
    return out


def ttft_timeline(result: RunResult, window: float) -> tuple[list[float], list[float]]:
    """Mean TTFT of the requests arriving in each `window` (unstarted: left out)."""
    if not result.arrivals:
        return [], []
    buckets: dict[int, list[float]] = {}
    for a, t in zip(result.arrivals, result.ttft, strict=True):
        if math.isfinite(t):
            buckets.setdefault(int(a // window), []).append(t)
    keys = sorted(buckets)
    return [k * window for k in keys], [float(np.mean(buckets[k])) for k in keys]
