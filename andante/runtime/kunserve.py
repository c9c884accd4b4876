"""KunServe on in-process engines: `LocalPipelineGroups`, the seam's `PipelineGroups`
over `LocalInstance`s (andante.cluster.kunserve.seam states the contract), and the
coordinator of `andante serve --router kunserve` over them.

Design note (KunServe §4.1, §4.2, §4.4). Every instance's worker thread steps its own
engine, so a group forms and dissolves at a step boundary of all its members: the
operation is posted to each member's inbox (`InstanceWorker.at_boundary`), the members
park there and the leader's thread carries it out (`kunserve_parts.Rendezvous`).

Forming (`form_group`; the boundary's steps: andante.runtime.kunserve_form):
1. while the members still serve, the stages are built: each member's layer slice with
   a KV pool sized by its old pool plus the weights it drops (andante.exec.torch_pipeline);
2. at the boundary, the leader's engine switches to the `PipelineExecutor`, its block
   manager grows to the group's block count, the members' shrink to none (their memory
   is their stage now) and their executors (their weights) are released;
3. every member's requests move into the leader's scheduler (andante.cluster.kunserve.
   adopt: waiting ones re-queued, running ones adopted with a new block table);
4. each member's kept layers are copied into its stage pool in bulk; every other block
   move is a `KVExchange` run between the leader's steps, bounded per step (activations
   first), the adopted requests held out of the schedules until their KV has arrived;
   `kv_mode="recompute"` recomputes them instead;
5. members are not `alive` to routers, and pass the requests that still reach them on to
   the leader (`redirect`).

Dissolving (`dissolve_group`; the boundary's steps: andante.runtime.kunserve_restore):
the full executors are rebuilt from each member's host copy of the weights (the
`LoadedModel`) while the group keeps serving (on the caller's thread, or a thread of its
own with `background_restore`); then, at one boundary, the rest of the exchange
completes, the leader's block manager shrinks back (running requests past that size are
recomputed, newest first), the KV comes back from the stages into the leader's full
pool, and every member serves alone again; requests stay at the leader. A member whose
thread dies makes the leader restore at its next boundary without that member's layers:
every request holding KV is recomputed there (its output so far kept; nothing is lost or
failed). A leader that dies leaves its requests to the controller (re-queued or failed,
as for any instance) and its members restore.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from andante.cluster.kunserve.coordinator import KunServeCoordinator
from andante.cluster.kunserve.plan import LayerMemory
from andante.cluster.kunserve.router import KunServeRouter, KunServeSettings
from andante.cluster.kunserve.seam import GroupPlan
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_pipeline import (
    PipelineExecutor,
    device_kv_bytes,
    layer_block_bytes,
    layer_weight_bytes,
    stage_memory,
)
from andante.models.loader import parse_dtype
from andante.runtime.kunserve_form import (
    adopt_requests,
    build_pipeline,
    exchange_step,
    start_exchange,
    switch_to_pipeline,
)
from andante.runtime.kunserve_parts import (
    FormReport,
    Group,
    LocalGroupOptions,
    Origin,
    Rendezvous,
    RestoreReport,
    refresh_max_num_tokens,
)
from andante.runtime.kunserve_restore import copy_back, finish_exchange, give_back, shed
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker

log = logging.getLogger("andante.cluster")
# the members' executors when the stages were built, the group's executor, seconds
_Prepared = tuple[dict[int, TorchExecutor], PipelineExecutor, float]


class LocalPipelineGroups:
    """KunServe's `PipelineGroups` over in-process instances (see the module note).
    `form_group` and `dissolve_group` block the caller until the leader's thread has
    carried them out (call them off an event loop)."""

    def __init__(self, instances: Sequence[LocalInstance],
                 options: LocalGroupOptions | None = None) -> None:
        self.options = options or LocalGroupOptions()
        self._instances = {inst.index: inst for inst in instances}
        self._workers: dict[int, InstanceWorker] = {i: inst.worker
                                                    for i, inst in self._instances.items()}
        self._groups: dict[int, Group] = {}  # by leader
        self._lock = threading.Lock()
        self._forming: set[int] = set()  # members of groups being formed
        self._restoring: set[int] = set()  # leaders of groups being restored
        self._preparing = False  # a thread builds stages (background_prepare)
        self._prepared: tuple[GroupPlan, _Prepared] | None = None
        self.form_reports: list[FormReport] = []
        self.restore_reports: list[RestoreReport] = []
        for inst in instances:
            inst.failure_listeners.append(self._on_failure)

    # ---- the seam ---------------------------------------------------------------------
    def groups(self) -> list[GroupPlan]:
        with self._lock:
            return [g.plan for g in self._groups.values()]

    def leader_of(self, index: int) -> int | None:
        with self._lock:
            return next((g.plan.leader for g in self._groups.values()
                         if index in g.plan.members), None)

    def accepting(self, index: int) -> bool:
        """False for a member that is not its group's leader."""
        leader = self.leader_of(index)
        return leader is None or leader == index

    def form_group(self, plan: GroupPlan) -> bool:
        """Form `plan`'s group (module note). With `background_prepare` the stages are
        built on a thread of their own and this returns False until they are ready; the
        call after that (the coordinator asks again while the pressure lasts) forms it."""
        with self._lock:
            if not self._can_form(plan):
                return False
            prepared = self._take_prepared(plan)
            if prepared is None and self.options.background_prepare:
                self._start_preparing(plan)
                return False
            self._forming |= set(plan.members)
        try:
            executors, pipeline, prepare_seconds = prepared or self._prepare(plan)
            return self._at_boundaries(plan.leader, plan.members[1:], lambda: self._form(
                plan, executors, pipeline, prepare_seconds)).wait()
        finally:
            with self._lock:
                self._forming -= set(plan.members)

    def _prepare(self, plan: GroupPlan) -> _Prepared:
        """The group's executor, built while the members still serve."""
        executors: dict[int, TorchExecutor] = {
            m: self._workers[m].engine.executor for m in plan.members}  # type: ignore[misc]
        started = time.perf_counter()
        pipeline = build_pipeline(plan, executors)
        return executors, pipeline, time.perf_counter() - started

    def _take_prepared(self, plan: GroupPlan) -> _Prepared | None:
        """(With the lock held.) The stages built for `plan`, if they are ready."""
        if self._prepared is not None and self._prepared[0] == plan:
            prepared, self._prepared = self._prepared[1], None
            return prepared
        return None

    def _start_preparing(self, plan: GroupPlan) -> None:
        """(With the lock held.) Build `plan`'s stages on a thread (one plan at a time;
        stages ready for another plan are dropped)."""
        if self._preparing:
            return
        self._preparing = True
        self._prepared = None

        def run() -> None:
            try:
                prepared = self._prepare(plan)
                with self._lock:
                    self._prepared = (plan, prepared)
            except Exception:
                log.exception("kunserve: preparing group %s failed", plan.members)
            finally:
                with self._lock:
                    self._preparing = False

        threading.Thread(target=run, daemon=True,
                         name=f"andante-kunserve-prepare-{plan.leader}").start()

    def dissolve_group(self, leader: int) -> bool:
        """Restore the group led by `leader` (module note); with `background_restore`
        it returns True once the restore has started (a thread reloads the weights,
        then the leader switches at a step boundary)."""
        with self._lock:
            group = self._groups.get(leader)
            if group is None or leader in self._restoring:
                return False
            self._restoring.add(leader)
        if self.options.background_restore:
            threading.Thread(target=self._dissolve, args=(group,), daemon=True,
                             name=f"andante-kunserve-restore-{leader}").start()
            return True
        return self._dissolve(group)

    def _dissolve(self, group: Group) -> bool:
        try:
            started = time.perf_counter()
            fresh = {m: o.build() for m, o in group.origins.items()}  # while it serves
            load_seconds = time.perf_counter() - started
            parked = [m for m in group.plan.members[1:] if self._instances[m].running]
            return self._at_boundaries(group.plan.leader, parked, lambda: self._restore(
                group, fresh, load_seconds, None)).wait()
        finally:
            with self._lock:
                self._restoring.discard(group.plan.leader)

    def _at_boundaries(self, leader: int, parked: Sequence[int],
                       operation: Callable[[], bool]) -> Rendezvous:
        """Run `operation` on the leader's thread once the `parked` members' threads
        wait at their step boundaries (the module note's handshake)."""
        rendezvous = Rendezvous(parked, self.options.barrier_timeout_s)
        for member in parked:
            self._workers[member].at_boundary(rendezvous.parker(member))
        self._workers[leader].at_boundary(rendezvous.leader(operation))
        return rendezvous

    # ---- forming (the leader's thread, members parked) ---------------------------------
    def _can_form(self, plan: GroupPlan) -> bool:
        """(With the lock held.)"""
        grouped = {m for g in self._groups.values() for m in g.plan.members} | self._forming
        if len(plan.members) < 2 or grouped & set(plan.members):
            return False  # merging existing groups is not supported on the real engine
        if any(m not in self._instances or not self._instances[m].alive
               for m in plan.members) or self._restoring & set(plan.members):
            return False
        executors = [self._workers[m].engine.executor for m in plan.members]
        if not all(isinstance(e, TorchExecutor) for e in executors):
            return False
        layers = {e.model.config.num_layers for e in executors}  # type: ignore[attr-defined]
        return layers == {plan.num_layers}

    def _form(self, plan: GroupPlan, executors: dict[int, TorchExecutor],
              pipeline: PipelineExecutor, prepare_seconds: float) -> bool:
        """Forming's steps 2-5 (module note) at the boundary; False if a member's
        executor changed while the stages were built."""
        started = time.perf_counter()
        workers = {m: self._workers[m] for m in plan.members}
        if any(workers[m].engine.executor is not e for m, e in executors.items()):
            return False  # an executor changed while the stages were built
        lead_ex = executors[plan.leader]
        origins = {m: Origin(e.model, e.options, e.cost_model, e.kv.num_device_blocks)
                   for m, e in executors.items()}
        report = FormReport(plan, prepare_seconds=prepare_seconds, kv_blocks_before={
            m: w.engine.scheduler.kv.num_device_blocks for m, w in workers.items()})
        report.weight_bytes_dropped = sum(
            stage_memory(e.model, e.options, 0, s).dropped_weight_bytes
            for e, s in zip(executors.values(), plan.layer_slices, strict=True))
        leader_sched = workers[plan.leader].engine.scheduler
        leader_sched.kv.resize_device(pipeline.num_kv_blocks(lead_ex.options.block_size)[0])
        refresh_max_num_tokens(leader_sched)
        moves = adopt_requests(plan, workers, report)
        exchange = start_exchange(plan, executors, pipeline, report, moves,
                                  workers[plan.leader], self.options.exchange_chunk_blocks)
        switch_to_pipeline(plan, workers, self._instances, pipeline)
        group = Group(plan, pipeline, origins, report, exchange, started)
        with self._lock:
            self._groups[plan.leader] = group
        if exchange is not None:
            workers[plan.leader].add_task(lambda ran: exchange_step(
                group, workers[plan.leader], self.options.exchange_bytes_per_step, ran))
        report.kv_blocks_after = leader_sched.kv.num_device_blocks
        for worker in workers.values():
            worker.report_soon()
        report.seconds = time.perf_counter() - started
        self.form_reports.append(report)
        log.info("kunserve: formed group %s (%d -> %d KV blocks, %.3f s)", plan.members,
                 report.kv_blocks_before[plan.leader], report.kv_blocks_after, report.seconds)
        return True

    # ---- restoring (the leader's thread, members parked) -------------------------------
    def _restore(self, group: Group, fresh: dict[int, TorchExecutor], load_seconds: float,
                 failed: int | None) -> bool:
        """Dissolving at the boundary (module note), `failed` the member whose layers
        were lost; False if the group was restored already."""
        with self._lock:
            if self._groups.get(group.plan.leader) is not group:
                return False  # restored already (a member failed meanwhile)
        started = time.perf_counter()
        plan, leader = group.plan, self._workers[group.plan.leader]
        scheduler = leader.engine.scheduler
        report = RestoreReport(plan.leader, load_seconds=load_seconds, failed_member=failed,
                               kv_blocks_before=scheduler.kv.num_device_blocks)
        finish_exchange(group, scheduler, lost=failed is not None)
        report.num_recomputed = shed(scheduler, group.origins[plan.leader],
                                     everything=failed is not None)
        copy_back(group, scheduler, fresh[plan.leader], report)
        leader.engine.executor = fresh[plan.leader]
        refresh_max_num_tokens(scheduler)
        for member in plan.members[1:]:
            if member in fresh and member != failed:
                give_back(self._workers[member], self._instances[member], fresh[member],
                          group.origins[member])
        report.weight_bytes_reloaded = sum(
            stage_memory(group.origins[m].model, group.origins[m].options, 0, s
                         ).dropped_weight_bytes
            for m, s in zip(plan.members, plan.layer_slices, strict=True) if m in fresh)
        report.kv_blocks_after = {m: self._workers[m].engine.scheduler.kv.num_device_blocks
                                  for m in plan.members if m in fresh}
        with self._lock:
            del self._groups[plan.leader]
        for member in plan.members:
            self._workers[member].report_soon()
        report.seconds = time.perf_counter() - started
        self.restore_reports.append(report)
        log.info("kunserve: restored group %s (%.3f s, %d recomputed)", plan.members,
                 report.seconds, report.num_recomputed)
        return True

    # ---- failures ------------------------------------------------------------------------
    def _on_failure(self, index: int, cause: BaseException | None) -> None:
        """Called on the failed instance's thread as it dies."""
        with self._lock:
            group = next((g for g in self._groups.values() if index in g.plan.members), None)
        if group is None:
            return
        if index == group.plan.leader:
            self._leader_failed(group)
            return
        log.warning("kunserve: member %d of group %s failed (%s): restoring", index,
                    group.plan.members, cause)
        parked = [m for m in group.plan.members[1:]
                  if m != index and self._instances[m].running]

        def restore() -> bool:
            fresh = {m: group.origins[m].build() for m in group.plan.members if m != index}
            return self._restore(group, fresh, 0.0, index)

        self._at_boundaries(group.plan.leader, parked, restore)  # not waited for

    def _leader_failed(self, group: Group) -> None:
        """Each member serves alone again. The dead leader's requests (its members'
        among them) are the cluster's to re-queue or fail, as for any failed instance
        (`Controller.instance_failed`: the coordinator reassigned them to the leader)."""
        with self._lock:
            self._groups.pop(group.plan.leader, None)
        for member in group.plan.members[1:]:
            if self._instances[member].running:
                # alive again at once (the controller re-queues the leader's requests
                # here); its engine is rebuilt before anything else in its inbox
                self._instances[member].group_leader = None
                self._workers[member].at_boundary(
                    partial(self._rebuild_member, group.origins[member]), first=True)

    def _rebuild_member(self, origin: Origin, worker: InstanceWorker) -> None:
        give_back(self._workers[worker.index], self._instances[worker.index], origin.build(),
                  origin)
        worker.report_soon()


def layer_memory(executor: TorchExecutor) -> LayerMemory:
    """One unsplit instance's memory in the drop plan's units (andante.cluster.kunserve.
    plan), from its executor: a layer's weights, a layer's KV block, the KV pool."""
    model, options = executor.model, executor.options
    dtype = parse_dtype(options.dtype)
    weight = layer_weight_bytes(model.weights.layers[0]) * dtype.itemsize // max(
        1, model.weights.dtype.itemsize)
    return LayerMemory(
        num_layers=model.config.num_layers, weight_bytes_per_layer=weight,
        kv_block_bytes_per_layer=layer_block_bytes(model, dtype, options.block_size),
        kv_region_bytes=device_kv_bytes(executor.kv.num_device_blocks, model, options))


def serve_operators(router: KunServeRouter, instances: Sequence[object]
                    ) -> list[KunServeCoordinator]:
    """`andante serve --router kunserve` (andante.cluster.registry's hook): KunServe's
    coordinator over the in-process instances, with the router's settings
    (`--router-option`); none when dropping is off."""
    local = [inst for inst in instances if isinstance(inst, LocalInstance)]
    if len(local) != len(instances):
        raise ValueError("--router kunserve runs on in-process instances (--backend inprocess)")
    if not router.settings.drop:
        return []
    return [local_coordinator(local, router.settings)]


def local_coordinator(instances: Sequence[LocalInstance], settings: KunServeSettings,
                      options: LocalGroupOptions | None = None) -> KunServeCoordinator:
    """`--router kunserve` over in-process instances of a real model: the coordinator
    (a cluster operator) driving `LocalPipelineGroups` (restores in the background)."""
    executor = instances[0].worker.engine.executor
    if not isinstance(executor, TorchExecutor):
        raise ValueError("--router kunserve needs in-process instances of a real model "
                         "(not the toy backend)")
    groups = LocalPipelineGroups(instances, options or LocalGroupOptions(
        background_restore=True, background_prepare=True))
    kv_mode = "exchange" if settings.kv_mode == "auto" else settings.kv_mode
    return KunServeCoordinator(
        groups, layer_memory(executor), executor.options.block_size, settings.monitor,
        kv_mode=kv_mode,  # type: ignore[arg-type]
        max_members=settings.max_members, restore=settings.restore)
