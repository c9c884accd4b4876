"""The setups of the Ascendra experiment: models, workloads, SLOs and the systems compared.

Table 2 of the paper: Mistral-7B on ShareGPT (TTFT SLO 1 s, TBT SLO 0.15 s) and
Llama-3.1-8B on LongBench (TTFT 2.5 s, TBT 0.15 s), 3 x A100-80G, one GPU per instance.
ShareGPT lengths come from the ShareGPT trace in ../shared/traces. LongBench itself is
not available offline; `longbench_like` samples its shape instead — long summarization
prompts (log-normal, median 3,000 tokens, 800 to 7,500) and short, steady outputs
(log-normal, median 200, 32 to 600) — which the report states.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from andante.core.sampling import SLO
from andante.engine.config import SchedulerConfig
from andante.sim.spec import ClusterSpec, InstanceSpec
from andante.workload import RequestSpec, WorkloadConfig, build_workload
from andante.workload.arrivals import poisson
from andante.workload.slo import SLOConfig

MAX_CONTEXT = 8192
BASELINE_BATCH = 256  # vLLM's default max_num_seqs
LP_BATCH = 128  # Ascendra §6.2: a small batch on LP instances
HP_MAX_SEQS = 1024  # the HP policy's elastic batch is the real bound
# Tuned once on Mistral-7B/ShareGPT (see the report): offload against a 4,096-token HP
# batch; HP steps carry their decodes along (no decode stall).
LP_OPTIONS: dict[str, Any] = {"hp_batch_tokens": 4096}
HP_OPTIONS: dict[str, Any] = {"mixed": True}
SARATHI_OPTIONS: dict[str, Any] = {"token_budget": 2048}


@dataclass(frozen=True, slots=True)
class Setup:
    """One row of Table 2."""

    key: str
    title: str
    model: str
    lengths: str  # "sharegpt" or "longbench"
    ttft: float
    tbt: float
    hardware: str = "a100-80g"

    def workload(self, rate: float, num_requests: int | None, seed: int,
                 slo_scale: float = 1.0, duration: float | None = None) -> list[RequestSpec]:
        slo = SLO(ttft=self.ttft * slo_scale, tbt=self.tbt * slo_scale)
        if self.lengths == "sharegpt":
            specs = build_workload(WorkloadConfig(
                kind="poisson", rate=rate, num_requests=num_requests, duration=duration,
                lengths="sharegpt", max_context=MAX_CONTEXT, seed=seed,
                slo=SLOConfig(ttft=slo.ttft, tbt=slo.tbt, tds_distribution="none")))
            return specs
        return longbench_like(rate, num_requests, seed, slo, duration)


SETUPS = (
    Setup("mistral-sharegpt", "Mistral-7B, ShareGPT (TTFT 1 s, TBT 0.15 s)", "mistral-7b",
          "sharegpt", ttft=1.0, tbt=0.15),
    Setup("llama-longbench", "Llama-3.1-8B, LongBench-like long prompts (TTFT 2.5 s, "
          "TBT 0.15 s)", "llama-3.1-8b", "longbench", ttft=2.5, tbt=0.15),
)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, low: int, high: int,
               num: int) -> np.ndarray:
    values = rng.lognormal(np.log(median), sigma, size=num)
    return np.clip(np.rint(values), low, high).astype(np.int64)


def longbench_like(rate: float, num_requests: int | None, seed: int, slo: SLO,
                   duration: float | None = None) -> list[RequestSpec]:
    """Poisson arrivals with LongBench-shaped lengths (see the module note)."""
    arrival_rng, length_rng = (np.random.default_rng(s)
                               for s in np.random.SeedSequence(seed).spawn(2))
    times = poisson(rate, num_requests, arrival_rng, duration=duration)
    prompts = _lognormal(length_rng, 3000, 0.5, 800, 7500, len(times))
    outputs = _lognormal(length_rng, 200, 0.5, 32, 600, len(times))
    return [RequestSpec(float(t), int(p), int(o), slo)
            for t, p, o in zip(times, prompts, outputs, strict=True)]


@dataclass(frozen=True, slots=True)
class System:
    """A system compared: identical instances under one policy, or Ascendra's pools."""

    key: str
    label: str
    policy: str = ""
    policy_options: dict[str, Any] = field(default_factory=dict)
    num_lp: int = 0
    num_hp: int = 0
    lp_options: dict[str, Any] = field(default_factory=dict)
    hp_options: dict[str, Any] = field(default_factory=dict)

    def spec(self, setup: Setup, drop_late: bool = False,
             num_instances: int = 3) -> ClusterSpec:
        if not self.num_lp and not self.num_hp:
            return ClusterSpec(model=setup.model, hardware=setup.hardware,
                               drop_late=drop_late, num_instances=num_instances,
                               policy=self.policy, policy_options=dict(self.policy_options),
                               scheduler=SchedulerConfig(max_num_seqs=BASELINE_BATCH,
                                                         max_model_len=MAX_CONTEXT))
        lp = InstanceSpec(role="lp", policy="ascendra-lp",
                          policy_options={**LP_OPTIONS, **self.lp_options,
                                          "ttft_slo": setup.ttft, "tbt_slo": setup.tbt},
                          scheduler=SchedulerConfig(max_num_seqs=LP_BATCH,
                                                    max_model_len=MAX_CONTEXT))
        hp = InstanceSpec(role="hp", policy="ascendra-hp",
                          policy_options={**HP_OPTIONS, **self.hp_options,
                                          "ttft_slo": setup.ttft},
                          scheduler=SchedulerConfig(max_num_seqs=HP_MAX_SEQS,
                                                    max_model_len=MAX_CONTEXT))
        return ClusterSpec(model=setup.model, hardware=setup.hardware, drop_late=drop_late,
                           instances=(lp,) * self.num_lp + (hp,) * self.num_hp,
                           router="ascendra", router_options={"capacity": LP_BATCH})


VLLM = System("vllm", "vLLM (FCFS, prefill-first), 3 instances", policy="vllm-v0")
SARATHI = System("sarathi", "Sarathi-Serve (chunked prefill, 2048-token budget), 3 instances",
                 policy="sarathi", policy_options=SARATHI_OPTIONS)
SARATHI_512 = System("sarathi-512", "Sarathi-Serve, 512-token budget", policy="sarathi",
                     policy_options={"token_budget": 512})
ASCENDRA = System("ascendra", "Ascendra 2 LP + 1 HP", num_lp=2, num_hp=1)
ASCENDRA_1L2H = System("ascendra-1l2h", "Ascendra 1 LP + 2 HP", num_lp=1, num_hp=2)
SYSTEMS = (VLLM, SARATHI, SARATHI_512, ASCENDRA)
