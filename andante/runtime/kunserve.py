"""KunServe on in-process engines: `LocalPipelineGroups`, the seam's `PipelineGroups`
over `LocalInstance`s (andante.cluster.kunserve.seam states the contract), and the
coordinator of `andante serve --router kunserve` over them.

Design note (KunServe §4.1, §4.2, §4.4). The groups' state machine and the order of
forming and restoring one are andante.cluster.kunserve.groups' `PipelineGroupBook`;
`LocalPipelineGroups` is its site on the wall clock, with threads, and does the torch
side through andante.runtime.kunserve_stages. Every instance's worker thread steps its
own engine, so a group forms and dissolves at a step boundary of all its members: the
operation is posted to each member's inbox (`InstanceWorker.at_boundary`), the members
wait there and the leader's thread carries it out (`kunserve_parts.Rendezvous`). The
slow parts run while the instances serve: the stages are laid out before a formation
(on a thread of its own with `background_prepare`), the full executors rebuilt from the
host copy of the weights before a restore (with `background_restore`). Members are not
`alive` to routers while grouped and pass what still reaches them on to the leader. A
plan never merges two formed groups here, but a solo may join a formed group whose
leader keeps leading (a grow, `PipelineGroupBook.is_grow`): at a boundary of the leader
and the joiner the stages are re-split (andante.exec.torch_regroup's `regroup`, the
group's KV carried in bulk) and the joiner's requests adopted, their KV exchanged
chunk by chunk as in a formation; a group of three or more can release its last member
(shrink by one). Both are andante.runtime.kunserve_resize's `GroupResizing`.
With `pipelined` stages the leader's steps overlap in the group's pipeline
(andante.runtime.kunserve_loop's `GroupLoop`, set as the leader worker's loop when the
group forms); every group operation of the leader drains the pipeline first, at its
boundary, so none runs with a microbatch in flight.
A member whose thread dies makes the leader restore at its next boundary without that
member's layers: every request holding KV is recomputed there (its output so far kept;
nothing is lost or failed). A leader that dies leaves its requests to the controller
(re-queued or failed, as for any instance) and its members are rebuilt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from andante.cluster.kunserve.adopt import Adoption, KVMove
from andante.cluster.kunserve.coordinator import KunServeCoordinator
from andante.cluster.kunserve.groups import PipelineGroupBook, shed
from andante.cluster.kunserve.router import KunServeRouter, KunServeSettings
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import Request
from andante.engine.scheduler import Scheduler
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_microbatch import start_thread
from andante.exec.torch_pipeline import (
    PipelineExecutor,
    stage_memory,
)
from andante.exec.torch_regroup import regroup
from andante.runtime.kunserve_loop import GroupLoop
from andante.runtime.kunserve_parts import (
    Forming,
    FormReport,
    Group,
    LocalGroupOptions,
    Origin,
    Rendezvous,
    RestoreReport,
    Shrinking,
    refresh_max_num_tokens,
)
from andante.runtime.kunserve_resize import GroupResizing
from andante.runtime.kunserve_stages import (
    build_pipeline,
    copy_back,
    exchange_step,
    finish_exchange,
    give_back,
    grown_num_blocks,
    layer_memory,
    release_members,
    start_exchange,
    start_grow_exchange,
    switch_to_pipeline,
)
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker

log = logging.getLogger("andante.cluster")
# the members' executors when the stages were built, the group's executor, seconds
_Prepared = tuple[dict[int, TorchExecutor], PipelineExecutor, float]


@dataclass(slots=True)
class _Restoring:
    """What the site's steps need while the book restores a group."""

    group: Group
    fresh: dict[int, TorchExecutor]
    report: RestoreReport


class LocalPipelineGroups(GroupResizing):
    """KunServe's `PipelineGroups` over in-process instances (see the module note).
    `form_group` and `dissolve_group` block the caller until the leader's thread has
    carried them out (call them off an event loop)."""

    def __init__(self, instances: Sequence[LocalInstance],
                 options: LocalGroupOptions | None = None) -> None:
        self.options = options or LocalGroupOptions()
        self._instances = {inst.index: inst for inst in instances}
        self._workers: dict[int, InstanceWorker] = {i: inst.worker
                                                    for i, inst in self._instances.items()}
        self.book = PipelineGroupBook(self, _num_layers(instances[0].worker), merges=False)
        self._state: dict[int, Group] = {}  # by leader
        self._lock = threading.Lock()  # the book's and `_state`'s
        self._preparing = False  # a thread builds stages (background_prepare)
        self._prepared: tuple[GroupPlan, _Prepared] | None = None
        self._forming: Forming | None = None  # (the leader's thread, at the boundary)
        self._restoring: _Restoring | None = None
        self._shrinking: Shrinking | None = None
        self._releasing: set[int] = set()  # leaders whose shrink is under way
        self.form_reports: list[FormReport] = []
        self.restore_reports: list[RestoreReport] = []
        for inst in instances:
            inst.failure_listeners.append(self._on_failure)

    # ---- the seam ---------------------------------------------------------------------
    def groups(self) -> list[GroupPlan]:
        with self._lock:
            return self.book.plans()

    def leader_of(self, index: int) -> int | None:
        with self._lock:
            return self.book.leader_of(index)

    def accepting(self, index: int) -> bool:
        """False for a member that is not its group's leader."""
        with self._lock:
            return self.book.accepting(index)

    def form_group(self, plan: GroupPlan) -> bool:
        """Form `plan`'s group (module note). With `background_prepare` the stages are
        built on a thread of their own and this returns False until they are ready; the
        call after that (the coordinator asks again while the pressure lasts) forms it."""
        with self._lock:
            if self.book.units_of(plan) is None:
                return False
            grow = self.book.is_grow(plan)
            joiners = plan.members[len(self.book.layout(plan.leader).members):]
            prepared = None if grow else self._take_prepared(plan)
            if not grow and prepared is None and self.options.background_prepare:
                self._start_preparing(plan)
                return False
            self.book.propose(plan)
        if grow:
            return self._grow(plan, joiners)
        pipeline = None
        try:
            executors, pipeline, prepare_seconds = prepared or self._prepare(plan)
            return self._at_boundaries(plan.leader, plan.members[1:], lambda: (
                self._form_at_boundary(plan, executors, pipeline, prepare_seconds))).wait()
        finally:
            with self._lock:
                self.book.cancel(plan)  # (formed: no longer proposed)
            if pipeline is not None and \
                    self._workers[plan.leader].engine.executor is not pipeline:
                pipeline.close()  # not formed (the operation has ended): its workers stop

    def _prepare(self, plan: GroupPlan) -> _Prepared:
        """The group's executor, built while the members still serve."""
        executors: dict[int, TorchExecutor] = {
            m: self._workers[m].engine.executor for m in plan.members}  # type: ignore[misc]
        started = time.perf_counter()
        pipeline = build_pipeline(plan, executors, self.options.pipelined,
                                  self.options.lookahead, self.options.stage_workers)
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
        dropped, self._prepared = self._prepared, None

        def run() -> None:
            if dropped is not None:
                dropped[1][1].close()  # its stage workers (processes) stop
            try:
                prepared = self._prepare(plan)
                with self._lock:
                    replaced, self._prepared = self._prepared, (plan, prepared)
                if replaced is not None:
                    replaced[1][1].close()
            except Exception:
                log.exception("kunserve: preparing group %s failed", plan.members)
            finally:
                with self._lock:
                    self._preparing = False

        lead: TorchExecutor = self._workers[plan.leader].engine.executor  # type: ignore[assignment]
        start_thread(f"andante-kunserve-prepare-{plan.leader}", lead.num_threads, run)

    def dissolve_group(self, leader: int) -> bool:
        """Restore the group led by `leader` (module note); with `background_restore`
        it returns True once the restore has started (a thread reloads the weights,
        then the leader switches at a step boundary)."""
        with self._lock:
            if self.book.ask_restore(leader) is None:
                return False
            group = self._state[leader]
        if self.options.background_restore:
            start_thread(f"andante-kunserve-restore-{leader}", group.executor.num_threads,
                         self._dissolve, group)
            return True
        return self._dissolve(group)

    def _dissolve(self, group: Group) -> bool:
        try:
            started = time.perf_counter()
            fresh = {m: o.build() for m, o in group.origins.items()}  # while it serves
            load_seconds = time.perf_counter() - started
            parked = [m for m in group.plan.members[1:] if self._instances[m].running]
            return self._at_boundaries(group.plan.leader, parked, lambda: (
                self._restore_at_boundary(group, fresh, load_seconds, None))).wait()
        finally:
            with self._lock:
                self.book.restoring.discard(group.plan.leader)

    def _at_boundaries(self, leader: int, parked: Sequence[int],
                       operation: Callable[[], bool]) -> Rendezvous:
        """Run `operation` on the leader's thread once the `parked` members' threads
        wait at their step boundaries (the module note's handshake)."""
        rendezvous = Rendezvous(parked, self.options.barrier_timeout_s)
        for member in parked:
            self._workers[member].at_boundary(rendezvous.parker(member))
        # the worker drains its loop first: no microbatch in flight across the operation
        self._workers[leader].at_boundary(rendezvous.leader(operation))
        return rendezvous

    def leader_loop(self, index: int) -> GroupLoop:
        """The engine loop of the worker of `index` as a group's leader (created once,
        kept after a restore: andante.runtime.kunserve_loop)."""
        worker = self._workers[index]
        if not isinstance(worker.loop, GroupLoop):
            worker.loop = GroupLoop(worker.engine)
        return worker.loop

    # ---- forming (the leader's thread, members parked) ---------------------------------
    def _form_at_boundary(self, plan: GroupPlan, executors: dict[int, TorchExecutor],
              pipeline: PipelineExecutor, prepare_seconds: float) -> bool:
        """The book forms `plan` at the boundary; False if a member's executor changed
        while the stages were built."""
        started = time.perf_counter()
        workers = {m: self._workers[m] for m in plan.members}
        if any(workers[m].engine.executor is not e for m, e in executors.items()):
            return False  # an executor changed while the stages were built
        report = FormReport(plan, prepare_seconds=prepare_seconds, kv_blocks_before={
            m: w.engine.scheduler.kv.num_device_blocks for m, w in workers.items()})
        report.weight_bytes_dropped = sum(
            stage_memory(e.model, e.options, 0, s).dropped_weight_bytes
            for e, s in zip(executors.values(), plan.layer_slices, strict=True))
        origins = {m: Origin.of(e) for m, e in executors.items()}
        self._forming = Forming(executors, pipeline, origins, report, started)
        try:
            with self._lock:
                if self.book.form(plan) is None:
                    return False  # a member failed meanwhile
        finally:
            self._forming = None
        for worker in workers.values():
            worker.report_soon()
        report.seconds = time.perf_counter() - started
        self.form_reports.append(report)
        log.info("kunserve: formed group %s (%d -> %d KV blocks, %.3f s)", plan.members,
                 report.kv_blocks_before[plan.leader], report.kv_blocks_after, report.seconds)
        return True

    # ---- restoring (the leader's thread, members parked) -------------------------------
    def _restore_at_boundary(self, group: Group, fresh: dict[int, TorchExecutor],
                             load_seconds: float, failed: int | None) -> bool:
        """The book restores the group at the boundary, `failed` the member whose layers
        were lost; False if the group was restored already."""
        started = time.perf_counter()
        plan = group.plan
        scheduler = self._workers[plan.leader].engine.scheduler
        report = RestoreReport(plan.leader, load_seconds=load_seconds, failed_member=failed,
                               kv_blocks_before=scheduler.kv.num_device_blocks)
        self._restoring = _Restoring(group, fresh, report)
        try:
            with self._lock:
                if not self.book.restore(plan, failed):
                    return False  # restored already (a member failed meanwhile)
                self._state.pop(plan.leader, None)
        finally:
            self._restoring = None
        report.weight_bytes_reloaded = sum(
            stage_memory(group.origins[m].model, group.origins[m].options, 0, s
                         ).dropped_weight_bytes
            for m, s in zip(plan.members, plan.layer_slices, strict=True) if m in fresh)
        report.kv_blocks_after = {m: self._workers[m].engine.scheduler.kv.num_device_blocks
                                  for m in plan.members if m in fresh}
        for member in plan.members:
            self._workers[member].report_soon()
        report.seconds = time.perf_counter() - started
        self.restore_reports.append(report)
        log.info("kunserve: restored group %s (%.3f s, %d recomputed)", plan.members,
                 report.seconds, report.num_recomputed)
        return True

    # ---- the GroupSite (called by the book, on the leader's thread) --------------------
    def scheduler(self, index: int) -> Scheduler:
        return self._workers[index].engine.scheduler

    def can_join(self, index: int, pending: bool) -> bool:
        inst = self._instances.get(index)
        if inst is not None and inst.running and self.book.leader_of(index) is not None:
            return True  # a formed group's member or leader: a grow keeps its stage
        if inst is None or not inst.alive:
            return False
        executor = inst.worker.engine.executor
        return isinstance(executor, TorchExecutor) and \
            executor.model.config.num_layers == self.book.num_layers

    def group_blocks(self, plan: GroupPlan) -> int:
        if self._shrinking is not None:
            return grown_num_blocks(plan, self._shrinking.group.origins)
        forming = self._current_forming()
        if forming.grown is not None:
            return grown_num_blocks(plan, forming.origins)
        lead = forming.executors[plan.leader]
        return forming.pipeline.num_kv_blocks(lead.options.block_size)[0]

    def resize(self, index: int, num_blocks: int) -> None:
        scheduler = self._workers[index].engine.scheduler
        relocated = scheduler.kv.resize_device(num_blocks)
        refresh_max_num_tokens(scheduler)
        if self._forming is not None and self._forming.grown is not None:
            assert relocated is not None, "checked before the grow"
            self._forming.relocated = dict(relocated)
        if self._shrinking is not None:
            assert relocated is not None, "the book checked the blocks in use fit"
            self._shrinking.relocated = dict(relocated)

    def join(self, plan: GroupPlan, moved: Mapping[int, list[Request]]) -> None:
        """The members' requests into the leader's output adapter; the leader runs the
        group's executor, the members give up theirs and redirect to it."""
        leader = self._workers[plan.leader]
        for member, reqs in moved.items():
            source = self._workers[member]
            for req in reqs:
                source.adapter.discard(req.request_id)
                leader.adapter.register(req)
        workers = {m: self._workers[m] for m in plan.members}
        forming = self._current_forming()
        if forming.grown is not None:  # the stages re-split, the group's KV carried over
            regroup(forming.pipeline, plan.layer_slices,
                    leader.engine.scheduler.kv.num_device_blocks, forming.relocated)
            release_members(plan.leader, forming.executors, workers, self._instances)
            return
        switch_to_pipeline(plan, workers, self._instances, forming.pipeline)
        if self.options.pipelined:  # the leader's steps overlap in the stages
            self.leader_loop(plan.leader).run_on(forming.pipeline,
                                                 self.options.lookahead)

    def exchange(self, plan: GroupPlan, moves: list[KVMove], adoption: Adoption | None
                 ) -> None:
        if adoption is None:  # restoring: the KV comes back into the leader's full pool
            restoring = self._current_restoring()
            leader = self._workers[plan.leader]
            full = restoring.fresh[plan.leader]
            self.leader_loop(plan.leader).stop()  # (drained at the boundary)
            copy_back(restoring.group, leader.engine.scheduler, full, restoring.report)
            leader.engine.executor = full
            refresh_max_num_tokens(leader.engine.scheduler)
            return
        forming = self._current_forming()
        report, leader = forming.report, self._workers[plan.leader]
        report.num_adopted = len(adoption.adopted)
        report.num_requeued = len(adoption.requeued)
        report.num_recomputed = len(adoption.recomputed)
        if forming.grown is not None:
            exchange = start_grow_exchange(plan, forming.executors, forming.pipeline, moves,
                                           leader.engine.scheduler,
                                           self.options.exchange_chunk_blocks)
        else:
            exchange, copied = start_exchange(plan, forming.executors, forming.pipeline,
                                              moves, leader.engine.scheduler,
                                              self.options.exchange_chunk_blocks)
            report.kv_bytes_local += copied
        group = Group(plan, forming.pipeline, forming.origins, report, exchange,
                      forming.started)
        self._state[plan.leader] = group
        if exchange is not None:
            leader.add_task(lambda ran: exchange_step(
                group, leader, self.options.exchange_bytes_per_step, ran))
        report.kv_blocks_after = leader.engine.scheduler.kv.num_device_blocks

    def settle(self, plan: GroupPlan, lost: bool) -> None:
        group = self._shrinking.group if self._shrinking is not None \
            else self._current_restoring().group
        finish_exchange(group, self.scheduler(plan.leader), lost)

    def make_room(self, plan: GroupPlan, failed: int | None) -> bool:
        """Recompute what does not fit the leader's own pool (everything holding KV if
        a member's layers are lost)."""
        restoring = self._current_restoring()
        scheduler = self.scheduler(plan.leader)
        restoring.report.num_recomputed = shed(
            scheduler, restoring.group.origins[plan.leader].num_device_blocks,
            failed is not None, scheduler.clock.now())
        return True

    def leave(self, plan: GroupPlan, failed: int | None) -> None:
        restoring = self._current_restoring()
        for member in plan.members[1:]:
            if member in restoring.fresh and member != failed:
                give_back(self._workers[member], self._instances[member],
                          restoring.fresh[member], restoring.group.origins[member])

    def _current_forming(self) -> Forming:
        assert self._forming is not None, "called outside a formation"
        return self._forming

    def _current_restoring(self) -> _Restoring:
        assert self._restoring is not None, "called outside a restore"
        return self._restoring

    # ---- failures ------------------------------------------------------------------------
    def _on_failure(self, index: int, cause: BaseException | None) -> None:
        """Called on the failed instance's thread as it dies."""
        with self._lock:
            leader = self.book.leader_of(index)
            group = None if leader is None else self._state.get(leader)
        if group is None:
            return
        if index == group.plan.leader:
            self._leader_failed(group)
            return
        log.warning("kunserve: member %d of group %s failed (%s): restoring", index,
                    group.plan.members, cause)
        parked = [m for m in group.plan.members[1:]
                  if m != index and self._instances[m].running]

        def restore_without() -> bool:
            fresh = {m: group.origins[m].build() for m in group.plan.members if m != index}
            return self._restore_at_boundary(group, fresh, 0.0, index)

        self._at_boundaries(group.plan.leader, parked, restore_without)  # not waited for

    def _leader_failed(self, group: Group) -> None:
        """Each member serves alone again. The dead leader's requests (its members'
        among them) are the cluster's to re-queue or fail, as for any failed instance
        (`Controller.instance_failed`: the coordinator reassigned them to the leader)."""
        with self._lock:
            self.book.drop(group.plan.leader)
            self._state.pop(group.plan.leader, None)
        group.executor.close()  # its stage threads
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


def _num_layers(worker: InstanceWorker) -> int:
    """The model's layers (0 when the engine runs no real model: nothing can group)."""
    executor = worker.engine.executor
    return executor.model.config.num_layers if isinstance(executor, TorchExecutor) else 0


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
