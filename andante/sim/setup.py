"""Build a simulated cluster: N instances of the real engine over `SimExecutor`s, behind
the real cluster controller and a router chosen by name. Instances may differ in model,
hardware and parallelism (`InstanceSpec`), and serve several models each (QLM: the
cluster's `models` registry, andante.cluster.qlm.tiers); `andante.sim.cluster_file` reads such a
cluster from TOML."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from andante.cluster.ascendra import pool_plan
from andante.cluster.controller import Controller
from andante.cluster.qlm.router import preemption_mode_for
from andante.cluster.qlm.tiers import ModelTiers
from andante.cluster.registry import make_router
from andante.cluster.router import Router
from andante.core.clock import ManualClock
from andante.core.imports import load_class
from andante.engine.config import SchedulerConfig
from andante.engine.engine import Engine
from andante.exec.sim_executor import GIB, SimExecutor
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.sim.pipeline import build_pipeline_instance
from andante.sim.simulator import SimInstance, Simulator

# Routers whose cluster is built by another module (named, imported on demand).
CLUSTER_BUILDERS = MappingProxyType(
    {"kunserve": "andante.sim.kunserve_setup:build_kunserve_simulator",
     "llumnix": "andante.sim.llumnix:build_llumnix_simulator"})


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One instance that differs from the cluster's defaults (None: the default).

    role: what the router calls it (Ascendra: "lp" or "hp"). model: on its device at the
    start; warm: models in its host memory at the start (QLM §5)."""

    role: str = ""
    policy: str | None = None
    policy_options: dict[str, Any] | None = None
    scheduler: SchedulerConfig | None = None
    model: str | None = None
    hardware: str | None = None
    tp: int | None = None
    warm: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to simulate: a model on some hardware, N instances, policies and a router.

    The instances are identical unless `instances` gives one `InstanceSpec` each (then
    `num_instances` may be left at 1: it becomes len(instances)). `drop_late`: every
    instance drops requests still waiting past their TTFT SLO (Ascendra §6.3).
    `models`: the registry every instance may load from disk (QLM §5); with more than
    the instance's own model it becomes a multi-model instance that swaps on demand.
    `host_memory_gib`: host memory per instance for warm model weights.
    """

    model: str = "llama-3.1-8b"
    hardware: str = "a100-80g"
    tp: int = 1
    num_instances: int = 1
    policy: str = "vllm"
    policy_options: dict[str, Any] = field(default_factory=dict)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    swap_space_gib: float = 4.0  # host KV per GPU (vLLM's --swap-space default)
    gpu_memory_utilization: float = 0.9
    overlap_swaps: bool = False
    pp: int = 1  # pipeline stages per instance, `tp` GPUs each (andante.sim.pipeline)
    router: str = "round-robin"
    router_options: dict[str, Any] = field(default_factory=dict)
    instances: tuple[InstanceSpec, ...] = ()
    drop_late: bool = False
    models: tuple[str, ...] = ()
    host_memory_gib: float = 256.0
    auto_preemption: bool = False  # recompute or swap by cost per model (QLM Insight #2)

    def __post_init__(self) -> None:
        if self.instances and self.num_instances not in (1, len(self.instances)):
            raise ValueError(f"num_instances={self.num_instances} but {len(self.instances)} "
                             "instance specs were given")
        if self.instances:
            object.__setattr__(self, "num_instances", len(self.instances))
        if self.num_instances < 1:
            raise ValueError(f"num_instances must be >= 1, got {self.num_instances}")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.pp < 1:
            raise ValueError(f"pp must be >= 1, got {self.pp}")
        if self.host_memory_gib < 0:
            raise ValueError(f"host_memory_gib must be >= 0, got {self.host_memory_gib}")

    def instance_spec(self, index: int) -> ClusterSpec:
        """The spec of instance `index` alone (its overrides applied)."""
        if not self.instances:
            return self
        own = self.instances[index]
        return dataclasses.replace(
            self, num_instances=1, instances=(),
            policy=own.policy or self.policy,
            policy_options=self.policy_options if own.policy_options is None
            else own.policy_options,
            scheduler=own.scheduler or self.scheduler,
            model=own.model or self.model, hardware=own.hardware or self.hardware,
            tp=own.tp or self.tp,
        )

    def warm_of(self, index: int) -> tuple[str, ...]:
        return self.instances[index].warm if self.instances else ()

    def model_names(self) -> tuple[str, ...]:
        """Every model of the cluster: the registry, then the instances' own."""
        own = [self.instance_spec(i).model for i in range(self.num_instances)]
        return tuple(dict.fromkeys((*self.models, *own)))

    def role_of(self, index: int) -> str:
        return self.instances[index].role if self.instances else ""


def with_router(spec: ClusterSpec, router: str, num_hp: int = 1) -> ClusterSpec:
    """`spec` behind `router`; "ascendra" splits its instances into the LP and HP pools
    of `andante.cluster.ascendra.pool_plan` ("lp."/"hp." keys of `spec.policy_options`
    reach that pool's policy)."""
    if router == "qlm":  # eviction or state swap chosen by cost (QLM Insight #2)
        return dataclasses.replace(spec, router=router, auto_preemption=True)
    if router != "ascendra":
        return dataclasses.replace(spec, router=router)
    seqs = spec.scheduler.max_num_seqs
    members = tuple(InstanceSpec(m.role, m.policy, m.policy_options, dataclasses.replace(
        spec.scheduler, max_num_seqs=m.batch_factor * seqs))
        for m in pool_plan(spec.num_instances, num_hp, spec.policy_options))
    return dataclasses.replace(spec, router=router, num_instances=1, instances=members)


def build_cost_model(spec: ClusterSpec) -> CostModel:
    return CostModel(get_model(spec.model), get_hardware(spec.hardware), tp=spec.tp)


def _engine_of(own: ClusterSpec, clock: ManualClock) -> tuple[Engine, SimExecutor]:
    cost = build_cost_model(own)
    if own.auto_preemption:
        own = dataclasses.replace(own, scheduler=dataclasses.replace(
            own.scheduler, preemption_mode=preemption_mode_for(cost)))
    executor = SimExecutor(
        cost,
        block_size=own.scheduler.block_size,
        host_kv_bytes=int(own.swap_space_gib * GIB * own.tp),
        gpu_memory_utilization=own.gpu_memory_utilization,
        overlap_swaps=own.overlap_swaps,
        warmup_tokens=own.scheduler.max_model_len,  # as the real engine's warm-up
    )
    return build_engine(executor, clock, own.policy, own.scheduler, own.policy_options), executor


def _fits(own: ClusterSpec, model: str) -> bool:
    try:
        tokens = build_cost_model(dataclasses.replace(own, model=model)).kv_capacity_tokens(
            own.gpu_memory_utilization)
    except ValueError:  # the weights alone do not fit
        return False
    return tokens >= own.scheduler.block_size


def _servable(spec: ClusterSpec, own: ClusterSpec) -> dict[str, int]:
    """Weight bytes of the cluster's models whose weights and a KV block fit this
    instance's devices."""
    return {m: get_model(m).weight_bytes for m in spec.model_names()
            if m == own.model or _fits(own, m)}


def build_instance(spec: ClusterSpec, index: int, clock: ManualClock) -> SimInstance:
    own = spec.instance_spec(index)
    if own.pp > 1:
        inst = build_pipeline_instance(own, index, clock)
    else:
        engine, executor = _engine_of(own, clock)
        inst = SimInstance(index, engine, executor)
        sizes = _servable(spec, own)
        if len(sizes) > 1:
            tiers = ModelTiers(sizes, own.model, get_hardware(own.hardware), own.tp,
                               int(spec.host_memory_gib * GIB), list(spec.warm_of(index)))
            inst.serve_models(tiers, lambda m: _engine_of(
                dataclasses.replace(own, model=m), clock))
    inst.configure(spec.role_of(index), spec.drop_late)
    return inst


def build_simulator(
    spec: ClusterSpec, router: Router | None = None, decode_runs: bool = True
) -> Simulator:
    """The cluster `spec` describes; `router` replaces the one `spec.router` names."""
    chosen = router or make_router(spec.router, spec.router_options)
    builder = CLUSTER_BUILDERS.get(chosen.name)
    if builder is not None:  # a router that needs its own instances (KunServe's groups)
        simulator: Simulator = load_class(builder)(spec, chosen, decode_runs)
        return simulator
    clock = ManualClock()
    instances = [build_instance(spec, i, clock) for i in range(spec.num_instances)]
    return Simulator(instances, Controller(instances, chosen), clock, decode_runs)
