"""Build a simulated cluster: N instances of the real engine over `SimExecutor`s
(andante.sim.instances), behind the real cluster controller and a router chosen by name
(andante.cluster.registry: a router that needs a cluster of its own, KunServe's groups
or the Llumnix-like migrations, names the function building it)."""

from __future__ import annotations

import dataclasses

from andante.cluster.controller import Controller
from andante.cluster.registry import make_router, router_entry
from andante.cluster.router import Router
from andante.core.clock import ManualClock
from andante.sim.instances import build_instance
from andante.sim.simulator import Simulator
from andante.sim.spec import ClusterSpec, InstanceSpec


def with_router(spec: ClusterSpec, router: str, num_hp: int = 1) -> ClusterSpec:
    """`spec` behind `router`, as its registry entry says: a router with a pool plan
    splits the instances into its pools (Ascendra: the last `num_hp` are HP; "lp."/"hp."
    keys of `spec.policy_options` reach that pool's policy); one that chooses the
    preemption mode by cost turns `auto_preemption` on (QLM Insight #2); one that needs
    an engine policy (QLM's agents evict) runs it."""
    entry = router_entry(router)
    spec = dataclasses.replace(spec, router=router)
    if entry.preemption is not None:
        spec = dataclasses.replace(spec, auto_preemption=True)
    if entry.engine_policy is not None:
        spec = dataclasses.replace(spec, policy=entry.engine_policy)
    pool_plan = entry.hook("pool_plan")
    if pool_plan is None:
        return spec
    seqs = spec.scheduler.max_num_seqs
    members = tuple(InstanceSpec(m.role, m.policy, m.policy_options, dataclasses.replace(
        spec.scheduler, max_num_seqs=m.batch_factor * seqs))
        for m in pool_plan(spec.num_instances, num_hp, spec.policy_options))
    return dataclasses.replace(spec, num_instances=1, instances=members)


def build_simulator(
    spec: ClusterSpec, router: Router | None = None, decode_runs: bool = True
) -> Simulator:
    """The cluster `spec` describes; `router` replaces the one `spec.router` names."""
    chosen = router or make_router(spec.router, spec.router_options)
    builder = router_entry(chosen.name).hook("simulator")
    if builder is not None:  # a router that needs its own instances (KunServe's groups)
        simulator: Simulator = builder(spec, chosen, decode_runs)
        return simulator
    clock = ManualClock()
    instances = [build_instance(spec, i, clock) for i in range(spec.num_instances)]
    return Simulator(instances, Controller(instances, chosen), clock, decode_runs)
