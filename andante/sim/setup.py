"""Build a simulated cluster: N instances of the real engine over `SimExecutor`s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from andante.cluster.router import RoundRobinRouter, Router
from andante.core.clock import ManualClock
from andante.engine.factory import build_engine
from andante.exec.sim_executor import GIB, SimExecutor
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies.config import SchedulerConfig
from andante.sim.simulator import SimInstance, Simulator


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to simulate: a model on some hardware, N identical instances, a policy."""

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

    def __post_init__(self) -> None:
        if self.num_instances < 1:
            raise ValueError(f"num_instances must be >= 1, got {self.num_instances}")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")


def build_cost_model(spec: ClusterSpec) -> CostModel:
    return CostModel(get_model(spec.model), get_hardware(spec.hardware), tp=spec.tp)


def build_instance(spec: ClusterSpec, index: int, clock: ManualClock) -> SimInstance:
    executor = SimExecutor(
        build_cost_model(spec),
        block_size=spec.scheduler.block_size,
        host_kv_bytes=int(spec.swap_space_gib * GIB * spec.tp),
        gpu_memory_utilization=spec.gpu_memory_utilization,
        overlap_swaps=spec.overlap_swaps,
    )
    engine = build_engine(executor, clock, spec.policy, spec.scheduler, spec.policy_options)
    return SimInstance(index, engine)


def build_simulator(
    spec: ClusterSpec, router: Router | None = None, decode_runs: bool = True
) -> Simulator:
    clock = ManualClock()
    instances = [build_instance(spec, i, clock) for i in range(spec.num_instances)]
    return Simulator(instances, router or RoundRobinRouter(), clock, decode_runs)
