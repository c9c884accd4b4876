"""`--router kunserve` in the simulator: KunSimInstances, their groups, the coordinator.

The cluster is the one `ClusterSpec` describes (each instance built by
`andante.sim.setup.build_instance`), re-wrapped as `KunSimInstance`s over an
inter-instance link, driven by the real `Controller` with a `KunServeCoordinator` as
its cluster operator. The router's counters (`SimReport.router_counters`) carry the
coordinator's counts and the groups' exchange figures and bubble ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from andante.cluster.controller import Controller
from andante.cluster.kunserve.coordinator import KunServeCoordinator
from andante.cluster.kunserve.plan import LayerMemory
from andante.cluster.kunserve.router import KunServeRouter
from andante.cluster.kunserve.seam import GroupPlan, KVMode
from andante.core.clock import ManualClock
from andante.perf.cost_model import CostModel
from andante.perf.links import LinkSpec, get_link
from andante.sim.instances import build_instance
from andante.sim.kunserve_groups import SimPipelineGroups
from andante.sim.kunserve_instance import KunSimInstance
from andante.sim.simulator import Simulator
from andante.sim.spec import ClusterSpec


def layer_memory(cost: CostModel, num_blocks: int, block_size: int) -> LayerMemory:
    """One instance's memory per GPU (each tp rank drops its shard of a layer)."""
    model = cost.model
    per_layer = (model.dense_params_per_layer + 2 * model.hidden_size) * model.dtype_bytes
    kv_token = cost.kv_bytes_per_token_per_gpu
    return LayerMemory(
        num_layers=model.num_layers,
        weight_bytes_per_layer=per_layer // cost.tp,
        kv_block_bytes_per_layer=block_size * kv_token // model.num_layers,
        kv_region_bytes=num_blocks * block_size * kv_token,
    )


@dataclass(slots=True)
class KunServeCounters:
    """`SimReport.router_counters` of a KunServe run."""

    coordinator: KunServeCoordinator
    groups: SimPipelineGroups

    def summary(self) -> dict[str, int]:
        out = self.coordinator.counters.summary()
        forms = [e for e in self.groups.events if e.kind == "form"]
        out["kv_bytes_exchanged"] = sum(e.bytes_moved for e in self.groups.events)
        out["num_adopted_running"] = sum(e.num_adopted for e in forms)
        out["num_recomputed_running"] = sum(e.num_recomputed for e in forms)
        ratio = self.groups.bubble_ratio()
        out["bubble_permille"] = -1 if ratio is None else round(1000 * ratio)
        return out


def cheaper_kv_mode(groups: SimPipelineGroups) -> Callable[[GroupPlan], KVMode]:
    """A chooser: exchange unless re-prefilling the running requests costs less."""

    def choose(plan: GroupPlan) -> KVMode:
        tokens = sum(groups.instances[i].engine.stats().num_tokens for i in plan.members)
        cost = groups.instances[plan.leader].full_cost
        moved = tokens * cost.kv_bytes_per_token_per_gpu * (1 - 1 / len(plan.members))
        exchange = groups.link.transfer_time(moved)
        return "exchange" if exchange <= cost.prefill_time(min(tokens, 8192)) * max(
            1, tokens / 8192) else "recompute"

    return choose


def build_kunserve_simulator(spec: ClusterSpec, router: KunServeRouter,
                             decode_runs: bool = True) -> Simulator:
    clock = ManualClock()
    settings = router.settings
    link: LinkSpec = get_link(settings.link)
    plain = [build_instance(spec, i, clock) for i in range(spec.num_instances)]
    instances = [KunSimInstance(p.index, p.engine, p.runs, link, spec.tp) for p in plain]
    for inst in instances:
        inst.configure(spec.role_of(inst.index), spec.drop_late)
    first = instances[0]
    memory = layer_memory(first.full_cost, first.engine.scheduler.kv.num_device_blocks,
                          spec.scheduler.block_size)
    groups = SimPipelineGroups(instances, memory, link, coordinated=settings.coordinated,
                               lookahead=settings.lookahead)
    coordinator = KunServeCoordinator(
        groups, memory, spec.scheduler.block_size, settings.monitor,
        kv_mode=settings.kv_mode,  # type: ignore[arg-type]
        choose_kv_mode=cheaper_kv_mode(groups),
        max_members=settings.max_members, restore=settings.restore)
    router.counters = KunServeCounters(coordinator, groups)  # type: ignore[attr-defined]
    operators = (coordinator,) if settings.drop else ()
    controller = Controller(instances, router, operators)
    return Simulator(list(instances), controller, clock, decode_runs)
