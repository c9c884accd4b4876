"""Resizing a formed KunServe pipeline group on in-process engines: a solo joins it
(grow) or its last member leaves (shrink by one); KunServe §4.1, §4.4.

Design note. `GroupResizing` is the part of `LocalPipelineGroups` (andante.runtime.
kunserve) that changes a formed group's member list; the book (andante.cluster.kunserve.
groups: `form` of a plan `is_grow` accepts, `shrink`) orders the steps and the site's
`group_blocks`, `resize`, `join`, `exchange`, `settle` and `shrink_to` carry them out.
- Grow: the drop plan appends a solo to a pressed group whose leader keeps leading
  (`plan.merged`). At a step boundary of the leader and the joiner (the group's other
  members run no engine), the exchange still under way completes, the leader's blocks
  grow to the new member list's count, andante.exec.torch_regroup re-splits the stages
  and carries the group's KV to them in bulk, and the joiner's requests are adopted by
  the leader, their KV queued as a formation's is (chunked between steps, §4.2). The
  stages are built at the boundary (not laid out ahead while serving, as a formation's
  are with `background_prepare`).
- Shrink by one (andante.cluster.kunserve.shrink decides when): the leaving member's
  full executor is rebuilt from its host copy while the group serves; at a boundary of
  the leader and that member the blocks in use are compacted below the smaller count,
  the stages are re-split (its layers' KV carried to their new holders in bulk) and it
  serves alone again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from andante.cluster.kunserve.adopt import KVMove
from andante.cluster.kunserve.groups import PipelineGroupBook
from andante.cluster.kunserve.seam import GroupPlan
from andante.cluster.kunserve.shrink import shrunk
from andante.engine.scheduler import Scheduler
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_microbatch import start_thread
from andante.exec.torch_pipeline import stage_memory
from andante.exec.torch_regroup import regroup
from andante.runtime.kunserve_parts import (
    Forming,
    FormReport,
    Group,
    LocalGroupOptions,
    Origin,
    Rendezvous,
    Shrinking,
)
from andante.runtime.kunserve_stages import finish_exchange, give_back, grown_num_blocks
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker

log = logging.getLogger("andante.cluster")


class GroupResizing:
    """Grow and shrink by one, for `LocalPipelineGroups` (see the module note)."""

    options: LocalGroupOptions
    book: PipelineGroupBook
    form_reports: list[FormReport]
    _instances: dict[int, LocalInstance]
    _workers: dict[int, InstanceWorker]
    _state: dict[int, Group]
    _lock: threading.Lock
    _forming: Forming | None
    _shrinking: Shrinking | None
    _releasing: set[int]

    if TYPE_CHECKING:
        def _at_boundaries(self, leader: int, parked: Sequence[int],
                           operation: Callable[[], bool]) -> Rendezvous: ...

        def scheduler(self, index: int) -> Scheduler: ...

    def shrink_group(self, leader: int) -> bool:
        """Release the last member of the group `leader` leads (andante.cluster.kunserve.
        shrink): its full executor is rebuilt from its host copy while the group serves,
        then, at a boundary of the leader and that member, the book shrinks the group
        and the stages are re-split (`regroup`). With `background_restore` it returns
        True once the shrink has started."""
        with self._lock:
            plan = self.book.groups.get(leader)
            if plan is None or shrunk(plan) is None or leader in self.book.restoring or any(
                    leader in p.members for p in self.book.pending) \
                    or leader in self._releasing:
                return False
            group = self._state[leader]
            self._releasing.add(leader)
        if self.options.background_restore:
            start_thread(f"andante-kunserve-shrink-{leader}", group.executor.num_threads,
                         self._release_last, group)
            return True
        return self._release_last(group)

    def _release_last(self, group: Group) -> bool:
        try:
            leaving = group.plan.members[-1]
            fresh = group.origins[leaving].build()  # while the group serves
            parked = [leaving] if self._instances[leaving].running else []
            return self._at_boundaries(group.plan.leader, parked, lambda: (
                self._shrink_at_boundary(group, fresh))).wait()
        finally:
            with self._lock:
                self._releasing.discard(group.plan.leader)

    def _shrink_at_boundary(self, group: Group, fresh: TorchExecutor) -> bool:
        """The book shrinks the group at the boundary; False if it changed meanwhile
        or its blocks in use do not fit the smaller count."""
        started = time.perf_counter()
        with self._lock:
            if self._state.get(group.plan.leader) is not group:
                return False
        self._shrinking = Shrinking(group, fresh)
        try:
            with self._lock:
                smaller = self.book.shrink(group.plan.leader)
        finally:
            self._shrinking = None
        if smaller is None:
            return False
        for member in group.plan.members:
            self._workers[member].report_soon()
        log.info("kunserve: group %s released instance %d (%.3f s)", group.plan.members,
                 group.plan.members[-1], time.perf_counter() - started)
        return True

    def shrink_to(self, plan: GroupPlan, smaller: GroupPlan, moves: list[KVMove]) -> None:
        """The stages re-split over `smaller` (every layer's KV carried in bulk, the
        relocated blocks too: `moves` are among those copies); the leaving member
        serves alone again with its rebuilt executor."""
        shrinking = self._shrinking
        assert shrinking is not None, "called outside a shrink"
        group, leaving = shrinking.group, plan.members[-1]
        scheduler = self.scheduler(plan.leader)
        regroup(group.executor, smaller.layer_slices, scheduler.kv.num_device_blocks,
                shrinking.relocated)
        give_back(self._workers[leaving], self._instances[leaving], shrinking.fresh,
                  group.origins[leaving])
        origins = {m: o for m, o in group.origins.items() if m != leaving}
        self._state[plan.leader] = Group(smaller, group.executor, origins, group.report,
                                         None, group.formed_at)

    def _grow(self, plan: GroupPlan, joiners: Sequence[int]) -> bool:
        """Grow the group at a step boundary of its leader and the joiners (its other
        members run no engine); no stages to prepare: `regroup` re-splits them."""
        try:
            return self._at_boundaries(plan.leader, joiners, lambda: (
                self._grow_at_boundary(plan, joiners))).wait()
        finally:
            with self._lock:
                self.book.cancel(plan)

    def _grow_at_boundary(self, plan: GroupPlan, joiners: Sequence[int]) -> bool:
        """The book grows the group to `plan` at the boundary (a solo joins, the leader
        keeps leading); False if the group changed or the new count cannot hold the
        blocks in use."""
        started = time.perf_counter()
        with self._lock:
            group = self._state.get(plan.leader)
        executors = {j: self._workers[j].engine.executor for j in joiners}
        if group is None or not all(isinstance(e, TorchExecutor) for e in executors.values()):
            return False
        joined: dict[int, TorchExecutor] = executors  # type: ignore[assignment]
        scheduler = self._workers[plan.leader].engine.scheduler
        origins = {**group.origins, **{j: Origin.of(e) for j, e in joined.items()}}
        kv = scheduler.kv
        if grown_num_blocks(plan, origins) < kv.num_device_blocks - kv.num_free_device_blocks:
            return False
        finish_exchange(group, scheduler, lost=False)  # the group's own KV in place first
        report = FormReport(plan, kv_blocks_before={plan.leader: kv.num_device_blocks, **{
            j: e.kv.num_device_blocks for j, e in joined.items()}})
        report.weight_bytes_dropped = sum(
            stage_memory(origins[m].model, origins[m].options, 0, s).dropped_weight_bytes
            for m, s in zip(plan.members, plan.layer_slices, strict=True))
        self._forming = Forming(joined, group.executor, origins, report, started, group)
        try:
            with self._lock:
                if self.book.form(plan) is None:
                    return False  # a member failed meanwhile
        finally:
            self._forming = None
        for member in plan.members:
            self._workers[member].report_soon()
        report.seconds = time.perf_counter() - started
        self.form_reports.append(report)
        log.info("kunserve: grew group %s to %s (%d -> %d KV blocks, %.3f s)",
                 group.plan.members, plan.members, report.kv_blocks_before[plan.leader],
                 report.kv_blocks_after, report.seconds)
        return True
