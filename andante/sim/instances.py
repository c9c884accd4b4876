"""Build one simulated instance of a `ClusterSpec`: the real engine over a `SimExecutor`
(its cost model from the catalog), pipeline stages where `pp` > 1 (andante.sim.pipeline),
and the model tiers of a multi-model instance (andante.cluster.qlm.tiers)."""

from __future__ import annotations

import dataclasses

from andante.cluster.qlm.tiers import ModelTiers
from andante.cluster.registry import router_entry
from andante.core.clock import ManualClock
from andante.engine.engine import Engine
from andante.exec.sim_executor import GIB, SimExecutor
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.sim.pipeline import build_pipeline_instance
from andante.sim.simulator import SimInstance
from andante.sim.spec import ClusterSpec


def build_cost_model(spec: ClusterSpec) -> CostModel:
    return CostModel(get_model(spec.model), get_hardware(spec.hardware), tp=spec.tp)


def _engine_of(own: ClusterSpec, clock: ManualClock) -> tuple[Engine, SimExecutor]:
    cost = build_cost_model(own)
    choose = None
    if own.auto_preemption:  # eviction or state swap by cost, per request (the router's)
        choose = router_entry(own.router).hook("preemption")
        if choose is None:
            raise ValueError(f"router {own.router!r} chooses no preemption mode by cost")
    executor = SimExecutor(
        cost,
        block_size=own.scheduler.block_size,
        host_kv_bytes=int(own.swap_space_gib * GIB * own.tp),
        gpu_memory_utilization=own.gpu_memory_utilization,
        overlap_swaps=own.overlap_swaps,
        warmup_tokens=own.scheduler.max_model_len,  # as the real engine's warm-up
        num_device_blocks=own.num_kv_blocks,
    )
    engine = build_engine(executor, clock, own.policy, own.scheduler, own.policy_options)
    if choose is not None:
        engine.scheduler.preemption_mode_of = choose(cost)
    return engine, executor


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
