"""What to simulate: a cluster of instances of the real engine, as `ClusterSpec` says.

Instances may differ in model, hardware and parallelism (`InstanceSpec`), and serve
several models each (QLM: the cluster's `models` registry, andante.cluster.qlm.tiers);
`andante.sim.cluster_file` reads such a cluster from TOML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from andante.engine.config import SchedulerConfig


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
    num_kv_blocks: int | None = None  # device KV blocks per instance (None: from memory)
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
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
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
