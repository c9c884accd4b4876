"""KunServe's coordinator: a cluster operator that drops, restores and signals (§3-§4.4).

Design note (the paper's Figure 4: monitor -> global memory manager -> local managers).
After each instance step the controller calls `after_step`; at most every
`check_interval` seconds (engine clock) the coordinator
1. reads every serving unit's load (an ungrouped alive instance, or a group through its
   leader) and computes its unmet KV demand (`monitor.unmet_demand`);
2. if a unit throttles, runs Figure 6's greedy plan (`plan.drop_plan`) over the units,
   chooses each new group's KV mode (exchange or recompute, by cost when a chooser is
   given) and asks the `PipelineGroups` to form it; the leader now owns the members'
   requests (`Controller.reassign`); a plan that cannot free enough raises the
   scale-up signal;
3. restores a group whose usage fell to the restore threshold, or whose dropped memory
   lies idle (`monitor.Watches.restore_due`; `dissolve_group`); once it has restored,
   the leader's queued requests that never ran are spread over the members, back to
   serving alone (`Controller.migrate`);
4. lets a group of three or more members release its last member when the smaller
   group would hold its demand (`shrink.shrink_fits`, `ShrinkWatch`; the "shrink by
   one" between a drop and a restore), where the `PipelineGroups` can (`ShrinkingGroups`)
   and restores are on; a group of three or more whose dropped memory lies idle
   releases its last member instead of restoring whole (`_idle_shrink`), if the
   smaller group holds its demand;
5. raises the scale-up signal when a group's usage keeps rising after its drop.
A member that fails makes its partners restore (`member_failed`): the group's requests
that never streamed a token are re-queued, the others failed with a clear error.

It reads no clock and does no I/O: counters and `events` (time, kind, detail) are what
the simulator's report and the server's /metrics show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

from andante.cluster.controller import Controller, FailureOutcome
from andante.cluster.instance import fresh_copy
from andante.cluster.kunserve.monitor import (
    MonitorOptions,
    Watches,
    projected_demand,
    unmet_demand,
)
from andante.cluster.kunserve.plan import DropPlan, GroupState, LayerMemory, drop_plan
from andante.cluster.kunserve.seam import GroupPlan, KVMode, PipelineGroups
from andante.cluster.kunserve.shrink import ShrinkWatch, shrink_fits, shrunk
from andante.core.request import Request
from andante.engine.stats import SchedulerStats

KVModeOption = Literal["exchange", "recompute", "auto"]
KVModeChooser = Callable[[GroupPlan], KVMode]


EvictionCallback = Callable[[list[Request], list[Request]], None]


@runtime_checkable
class FailingGroups(Protocol):
    """A `PipelineGroups` that handles a member's failure: the group restores without
    it and, once its requests are out (at the group's next step boundary), calls
    `on_evicted(requeue, failed)`: the requests that never streamed a token (to
    re-queue) and the started ones, which it finished as failed with a clear reason
    and reported as finished."""

    def fail_member(self, index: int, on_evicted: EvictionCallback) -> None: ...


@runtime_checkable
class ShrinkingGroups(Protocol):
    """A `PipelineGroups` that can release a group's last member (`shrink_group`:
    True once the shrink is carried out or under way)."""

    def shrink_group(self, leader: int) -> bool: ...


@dataclass(slots=True)
class CoordinatorCounters:
    num_checks: int = 0
    num_throttles: int = 0
    num_drops: int = 0  # groups formed
    num_restores: int = 0
    num_shrinks: int = 0  # groups that released their last member
    num_scale_up_signals: int = 0
    num_failures: int = 0
    num_requeued: int = 0
    num_failed_requests: int = 0

    def summary(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class KunServeCoordinator:
    groups: PipelineGroups
    memory: LayerMemory
    block_size: int
    options: MonitorOptions = field(default_factory=MonitorOptions)
    kv_mode: KVModeOption = "exchange"
    choose_kv_mode: KVModeChooser | None = None
    max_members: int | None = None
    restore: bool = True
    counters: CoordinatorCounters = field(default_factory=CoordinatorCounters)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    _last_check: float = float("-inf")
    _watches: Watches = field(default_factory=Watches)
    _shrinks: ShrinkWatch = field(default_factory=ShrinkWatch)
    _throttled_before: bool = False
    _restoring: dict[int, tuple[int, ...]] = field(default_factory=dict)  # leader -> members
    _idle_restores: dict[int, int] = field(default_factory=dict)  # instance -> count
    _cooling_until: dict[int, float] = field(default_factory=dict)  # instance -> time
    # leader -> (members, idle) of a shrink asked for, not yet seen carried out
    _under_way: dict[int, tuple[tuple[int, ...], bool]] = field(default_factory=dict)

    # ---- the operator -------------------------------------------------------------
    def after_step(self, controller: Controller) -> None:
        now = max((slot.load.stats.time for slot in controller.slots if slot.alive),
                  default=0.0)
        if now - self._last_check < self.options.check_interval:
            return
        self._last_check = now
        self.counters.num_checks += 1
        units = self._units(controller, now)
        throttled = any(u.pressure for u in units)
        if throttled:
            self._drop(controller, units, now)
        self._throttled_before = throttled
        self._watch_groups(controller, now)
        self._spread_restored(controller)

    def _units(self, controller: Controller, now: float) -> list[GroupState]:
        grouped = {m for g in self.groups.groups() for m in g.members}
        layouts = [g for g in self.groups.groups()]
        layouts += [GroupPlan((s.index,), ((0, self.memory.num_layers),))
                    for s in controller.slots if s.alive and s.index not in grouped]
        # a group restoring is no unit to merge: its dropped memory lay idle, and merging
        # would call its restore off for a longer pipeline (issue 30 item 6)
        return [GroupState(plan, unmet_demand(controller.slots[plan.leader].load.stats,
                                              self.block_size, self.options))
                for plan in layouts if controller.slots[plan.leader].alive
                and plan.leader not in self._restoring
                and self._cooling_until.get(plan.leader, -1.0) <= now]

    # ---- drop (§4.1) ----------------------------------------------------------------
    def _drop(self, controller: Controller, units: list[GroupState], now: float) -> None:
        if not self._throttled_before:
            self.counters.num_throttles += 1
        demand = sum(u.pressure for u in units)
        plan = drop_plan(units, demand, self.memory, self.max_members)
        formed = [g for g in plan.groups if self._form(controller, g, now)]
        if not plan.satisfied and not self._throttled_before:
            self._signal_scale_up(now, f"no drop plan frees {demand} blocks "
                                       f"(best frees {plan.freed_blocks})")
        if formed:
            self.events.append((now, "drop", _describe(plan, formed)))

    def _form(self, controller: Controller, group: GroupPlan, now: float) -> bool:
        group = replace(group, kv_mode=self._kv_mode_for(group))
        if not self.groups.form_group(group):
            return False
        for member in group.members[1:]:
            controller.reassign(member, group.leader)
        self.counters.num_drops += 1
        self._watches.groups.pop(group.leader, None)
        self._shrinks.forget(group.leader)
        return True

    def _kv_mode_for(self, group: GroupPlan) -> KVMode:
        if self.kv_mode != "auto":
            return self.kv_mode
        return self.choose_kv_mode(group) if self.choose_kv_mode else "exchange"

    # ---- restore and scale-up (§4.4) ------------------------------------------------
    def _watch_groups(self, controller: Controller, now: float) -> None:
        base = self.memory.num_blocks_whole
        self._settle_shrinks(now)
        for group in self.groups.groups():
            stats = controller.slots[group.leader].load.stats
            due = self._watches.restore_due(group.leader, stats, base, now, self.options,
                                            len(group.members), self.block_size)
            if self._watches.keeps_rising(group.leader, self.options):
                self._signal_scale_up(now, f"usage of group {group.members} keeps rising "
                                           "after the drop")
            if due and self.restore and self._idle_shrink(group, stats, now):
                continue
            if due and self.restore and self.groups.dissolve_group(group.leader):
                self.counters.num_restores += 1
                idle = self._watches.idle_memory(group.leader)
                self._back_off(group.members, idle, now)
                self._watches.groups.pop(group.leader, None)
                self._restoring[group.leader] = group.members
                self._shrinks.forget(group.leader)
                self.events.append((now, "restore", f"group {list(group.members)}" + (
                    " (dropped memory idle)" if idle else "")))
            elif self.restore:
                self._shrink(group, stats, now)

    def _shrink(self, group: GroupPlan, stats: SchedulerStats, now: float) -> None:
        """Release the group's last member if the smaller group has held its demand
        long enough (andante.cluster.kunserve.shrink)."""
        if not isinstance(self.groups, ShrinkingGroups):
            return
        fits = shrink_fits(group, stats, self.memory, self.block_size, self.options)
        if not self._shrinks.due(group, fits, now, self.options) \
                or not self.groups.shrink_group(group.leader):
            return
        self._shrink_asked(group, False, now)

    def _idle_shrink(self, group: GroupPlan, stats: SchedulerStats, now: float) -> bool:
        """Relief on a group of three or more whose dropped memory lies idle (the idle
        rule found its restore due): release its last member first, if the smaller group
        holds its projected demand within `restore_fit` of its blocks; a pair restores.
        A whole restore waits until one instance holds every request (the leader keeps
        them), paying the deepest pipeline meanwhile; shrinking by one steps down at
        once (before this rule, a quad on 4 instances restored whole, never shrank). The
        released member backs off as after an idle restore (`_back_off`)."""
        if not self._watches.idle_memory(group.leader) \
                or not isinstance(self.groups, ShrinkingGroups):
            return False
        smaller = shrunk(group)
        if smaller is None:
            return False
        demand = projected_demand(stats, self.block_size, self.options.decode_tokens,
                                  self.options.queue_horizon_tokens)
        if demand > self.options.restore_fit * self.memory.group_blocks(smaller) \
                or not self.groups.shrink_group(group.leader):
            return False
        self._shrink_asked(group, True, now)
        return True

    def _shrink_asked(self, group: GroupPlan, idle: bool, now: float) -> None:
        self._shrinks.forget(group.leader)  # no second request while it is under way
        self._watches.groups.pop(group.leader, None)
        self._under_way[group.leader] = (group.members, idle)
        self._settle_shrinks(now)

    def _settle_shrinks(self, now: float) -> None:
        """Count a shrink asked for once the group is one member fewer: it is carried
        out at a drained boundary, where it can fail (the group stays, or changes
        otherwise); then nothing is counted."""
        current = {g.leader: g.members for g in self.groups.groups()}
        for leader, (members, idle) in list(self._under_way.items()):
            if current.get(leader) == members:
                continue  # under way
            del self._under_way[leader]
            if current.get(leader) != members[:-1]:
                continue
            self.counters.num_shrinks += 1
            self._shrinks.forget(leader)
            self._watches.groups.pop(leader, None)
            if idle:
                self._back_off(members[-1:], True, now)
            self.events.append((now, "shrink", f"group {list(members)} releases "
                                               f"instance {members[-1]}"))

    def _back_off(self, members: tuple[int, ...], idle: bool, now: float) -> None:
        """A group restored with its dropped memory idle was formed for pressure that was
        not on memory: its members join no group for `idle_backoff_seconds` x 2^(k-1)
        after their k-th such restore in a row (a restore after real use resets k)."""
        for index in members:
            count = self._idle_restores.get(index, 0) + 1 if idle else 0
            self._idle_restores[index] = count
            if count:
                wait = self.options.idle_backoff_seconds * 2 ** min(count - 1, 8)
                self._cooling_until[index] = now + wait

    def _spread_restored(self, controller: Controller) -> None:
        """Spread a restored group's queue (never-run requests) over its members."""
        grouped = {m for g in self.groups.groups() for m in g.members}
        for leader, members in list(self._restoring.items()):
            if leader in grouped:
                if not any(g.leader == leader for g in self.groups.groups()):
                    del self._restoring[leader]  # merged into another group meanwhile
                continue
            del self._restoring[leader]
            targets = [m for m in members if controller.slots[m].alive]
            queued = [r for r in controller.owned_by(leader)
                      if not r.num_computed_tokens and not r.num_output_tokens]
            for k, req in enumerate(queued):
                target = targets[k % len(targets)] if targets else leader
                if target != leader:
                    controller.migrate(req.request_id, target)

    def _signal_scale_up(self, now: float, reason: str) -> None:
        self.counters.num_scale_up_signals += 1
        self.events.append((now, "scale-up", reason))

    # ---- failures (§4.4 "Fault tolerance") -----------------------------------------
    def member_failed(self, controller: Controller, index: int) -> FailureOutcome:
        """Instance `index` failed: its partners restore, the group's requests are
        re-queued (not started) or were failed (started); an ungrouped instance fails as
        the controller handles any instance failure."""
        self.counters.num_failures += 1
        in_group = any(index in g.members for g in self.groups.groups())
        if not in_group or not isinstance(self.groups, FailingGroups):
            started = {r.request_id for r in controller.owned_by(index)
                       if r.num_output_tokens > 0}
            return controller.instance_failed(index, started.__contains__)
        controller.slots[index].down = True
        outcome = FailureOutcome()

        def evicted(requeue: list[Request], failed: list[Request]) -> None:
            for req in requeue:
                controller.on_finished(req.request_id)
                outcome.requeued.append(req.request_id)
                controller.submit(fresh_copy(req))
            outcome.failed += [req.request_id for req in failed]
            self.counters.num_requeued += len(requeue)
            self.counters.num_failed_requests += len(failed)
            now = max((r.timeline.finish_time or 0.0 for r in failed), default=0.0)
            self.events.append((now, "failure", f"instance {index}: {len(requeue)} "
                                                f"re-queued, {len(failed)} failed"))

        self.groups.fail_member(index, evicted)
        return outcome


def _describe(plan: DropPlan, formed: list[GroupPlan]) -> str:
    groups = "; ".join(f"{list(g.members)} {g.kv_mode}" for g in formed)
    return f"demand {plan.demand_blocks} blocks, frees {plan.freed_blocks}: {groups}"
