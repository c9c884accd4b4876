"""A Llumnix-like baseline for the KunServe experiment: rebalance by migration.

Design note (Llumnix, OSDI'24, as KunServe §2.3/§5.1 describes it: "load balancing to
cope with memory throttling of an instance, and migrates KVCache between instances").
A cluster operator checks every `check_interval` seconds the instances' virtual usage
(blocks in use plus the queued requests' demand, over the blocks) and, when the most
loaded is above `high` and the least loaded below `low`, moves one request from the
first to the second: a waiting request that never ran (the controller's `migrate`), else
the most recently admitted running request, live: its progress is kept, its KV copied
over the inter-instance link (`andante.perf.links`), and it stalls at the destination
until the copy lands. Llumnix overlaps most of the copy with decoding at the source and
stalls only for the last round; charging the whole copy is a conservative simplification.
Requests are dispatched to the least-loaded instance (`--router llumnix`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.cluster.controller import Controller
from andante.cluster.llumnix import LlumnixRouter
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
        ranked = sorted(self.instances, key=_virtual_usage)
        dst, src = ranked[0], ranked[-1]
        if _virtual_usage(src) <= self.router.high or _virtual_usage(dst) >= self.router.low:
            return
        waiting = [r for r in src.engine.scheduler.waiting
                   if r.status == RequestStatus.WAITING and not r.num_output_tokens]
        if waiting and controller.migrate(waiting[0].request_id, dst.index):
            self.counters.num_waiting_migrations += 1
            return
        self._migrate_running(controller, src, dst, now)

    def _migrate_running(self, controller: Controller, src: KunSimInstance,
                         dst: KunSimInstance, now: float) -> None:
        scheduler = src.engine.scheduler
        for req in reversed(scheduler.running):
            rid = req.request_id
            if rid in src.held or not dst.engine.scheduler.kv.can_allocate(
                    rid, req.num_computed_tokens):
                continue
            moved = scheduler.detach(rid)
            if moved is None:
                continue  # its batch is in flight
            if dst.engine.scheduler.adopt(moved) is None:  # (checked above)
                scheduler.adopt(moved)
                return
            num_bytes = moved.num_computed_tokens * src.full_cost.kv_bytes_per_token_per_gpu
            dst.hold([rid], now + self.link.transfer_time(num_bytes))
            controller.reassign(src.index, dst.index, {rid})
            self.counters.num_running_migrations += 1
            self.counters.kv_bytes_migrated += num_bytes * src.tp
            dst.hooks.wake(dst)
            return


def _virtual_usage(inst: KunSimInstance) -> float:
    stats = inst.engine.stats()
    if not stats.num_blocks:
        return 1.0
    used = stats.num_blocks - stats.num_free_blocks + stats.num_queued_kv_blocks
    return used / stats.num_blocks


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
