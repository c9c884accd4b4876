"""A Llumnix-like baseline for the KunServe experiment: the simulated cluster carries out
andante.cluster.llumnix's migration decisions.

Design note (Llumnix, OSDI'24 §4.4; the decisions and their rationale: andante.cluster.
llumnix). A cluster operator checks every `check_interval` seconds the instances'
freeness and, for each (source, destination) pair `migration_pairs` returns, moves one
request: the running one `pick_running` names (else, none fitting, a queued one that never
ran, through the controller's `migrate`), live: its progress is kept, its KV copied
over the inter-instance link (`andante.perf.links`), and it stalls at the destination
until the copy lands.
Llumnix overlaps most of the copy with decoding at the source and stalls only for the
last round; charging the whole copy is a conservative simplification (at 200 Gbps a
1,100-token 14B request's KV, 211 MB, takes ~9 ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.cluster.controller import Controller
from andante.cluster.llumnix import LlumnixRouter, migration_pairs, pick_running
from andante.core.clock import ManualClock
from andante.core.request import RequestStatus
from andante.perf.links import LinkSpec, get_link
from andante.sim.instances import build_instance
from andante.sim.kunserve_instance import KunSimInstance
from andante.sim.simulator import Simulator
from andante.sim.spec import ClusterSpec


@dataclass(slots=True)
class MigrationCounters:
    num_waiting_migrations: int = 0
    num_running_migrations: int = 0
    kv_bytes_migrated: int = 0

    def summary(self) -> dict[str, int]:
        return {"num_waiting_migrations": self.num_waiting_migrations,
                "num_running_migrations": self.num_running_migrations,
                "kv_bytes_migrated": self.kv_bytes_migrated}


@dataclass(slots=True)
class Rebalancer:
    instances: list[KunSimInstance]
    router: LlumnixRouter
    link: LinkSpec
    counters: MigrationCounters = field(default_factory=MigrationCounters)
    _last_check: float = float("-inf")

    def after_step(self, controller: Controller) -> None:
        now = self.instances[0].engine.clock.now()
        if now - self._last_check < self.router.check_interval:
            return
        self._last_check = now
        loads = [(inst.index, inst.engine.stats()) for inst in self.instances
                 if inst.alive]
        router = self.router
        for pair in migration_pairs(loads, router.out_threshold, router.in_threshold,
                                    router.gap):
            src, dst = self.instances[pair.source], self.instances[pair.destination]
            if self._migrate_running(controller, src, dst, now):
                continue
            waiting = [r for r in src.engine.scheduler.waiting
                       if r.status == RequestStatus.WAITING and not r.num_output_tokens
                       and not r.num_computed_tokens]
            if waiting and controller.migrate(waiting[0].request_id, dst.index):
                self.counters.num_waiting_migrations += 1

    def _migrate_running(self, controller: Controller, src: KunSimInstance,
                         dst: KunSimInstance, now: float) -> bool:
        if src.decode_run is not None or dst.decode_run is not None:
            return False  # a run of decode steps is in flight: its requests stay put
        scheduler = src.engine.scheduler
        candidates = [(r.request_id, scheduler.kv.num_device_blocks_of(r.request_id))
                      for r in scheduler.running if r.request_id not in src.held]
        dst_kv = dst.engine.scheduler.kv
        rid = pick_running(candidates, dst_kv.num_free_device_blocks, reserve_blocks=1)
        if rid is None:
            return False
        moved = scheduler.detach(rid)
        if moved is None:
            return False  # its batch is in flight
        if dst.engine.scheduler.adopt(moved) is None:
            scheduler.adopt(moved)
            return False
        num_bytes = moved.num_computed_tokens * src.full_cost.kv_bytes_per_token_per_gpu
        dst.hold([rid], now + self.link.transfer_time(num_bytes))
        controller.reassign(src.index, dst.index, {rid})
        self.counters.num_running_migrations += 1
        self.counters.kv_bytes_migrated += num_bytes * src.tp
        dst.hooks.wake(dst)
        src.hooks.wake(src)
        return True


def build_llumnix_simulator(spec: ClusterSpec, router: LlumnixRouter,
                            decode_runs: bool = True) -> Simulator:
    clock = ManualClock()
    link = get_link(router.link)
    plain = [build_instance(spec, i, clock) for i in range(spec.num_instances)]
    instances = [KunSimInstance(p.index, p.engine, p.runs, link, spec.tp) for p in plain]
    for inst in instances:
        inst.configure(spec.role_of(inst.index), spec.drop_late)
    rebalancer = Rebalancer(instances, router, link)
    router.counters = rebalancer.counters  # type: ignore[attr-defined]
    controller = Controller(instances, router, (rebalancer,))
    return Simulator(list(instances), controller, clock, decode_runs)
