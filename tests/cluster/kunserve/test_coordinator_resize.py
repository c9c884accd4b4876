"""KunServe's coordinator changes a formed group's size (one decision for both clocks):
a pressed group grows by a solo that joins it, the leader kept; once the group without
its last member holds the demand for the restore window it releases that member."""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.cluster.kunserve.coordinator import KunServeCoordinator
from andante.cluster.kunserve.monitor import MonitorOptions
from andante.cluster.kunserve.plan import LayerMemory, balanced_slices
from andante.cluster.kunserve.seam import GroupPlan
from andante.cluster.kunserve.shrink import shrunk
from andante.cluster.load import LoadReport
from andante.core.request import Request
from andante.engine.stats import SchedulerStats

MEMORY = LayerMemory(num_layers=8, weight_bytes_per_layer=10, kv_block_bytes_per_layer=1,
                     kv_region_bytes=80)  # 10 blocks alone, 30 as a pair, 45 as a triple
PAIR = GroupPlan((0, 1), balanced_slices(2, 8))
OPTIONS = MonitorOptions(check_interval=0.0, decode_tokens=0, min_group_seconds=1.0,
                         restore_window_seconds=5.0, idle_restore_seconds=1e9)


@dataclass
class Slot:
    index: int
    load: LoadReport = field(default_factory=LoadReport)
    alive: bool = True


@dataclass
class FakeController:
    slots: list[Slot]
    reassigned: list[tuple[int, int]] = field(default_factory=list)

    def reassign(self, source: int, target: int) -> int:
        self.reassigned.append((source, target))
        return 0

    def owned_by(self, index: int) -> list[Request]:
        return []

    def set(self, index: int, now: float, used: int, blocks: int, waiting: int = 0,
            queued: int = 0) -> None:
        self.slots[index].load = LoadReport(SchedulerStats(
            time=now, num_running=1, num_waiting=waiting, num_blocks=blocks,
            num_free_blocks=blocks - used, num_queued_kv_blocks=queued))


@dataclass
class FakeGroups:
    """`PipelineGroups` and `ShrinkingGroups` that carry every request out at once."""

    plans: dict[int, GroupPlan] = field(default_factory=dict)
    formed: list[GroupPlan] = field(default_factory=list)
    shrunk: list[int] = field(default_factory=list)

    def form_group(self, plan: GroupPlan) -> bool:
        for member in plan.members:
            self.plans.pop(member, None)
        self.plans[plan.leader] = plan
        self.formed.append(plan)
        return True

    def dissolve_group(self, leader: int) -> bool:
        return self.plans.pop(leader, None) is not None

    def groups(self) -> list[GroupPlan]:
        return list(self.plans.values())

    def shrink_group(self, leader: int) -> bool:
        smaller = shrunk(self.plans[leader])
        assert smaller is not None
        self.plans[leader] = smaller
        self.shrunk.append(leader)
        return True


def test_a_pressed_group_grows_then_shrinks_by_one() -> None:
    groups = FakeGroups({0: PAIR})
    coordinator = KunServeCoordinator(groups, MEMORY, block_size=1, options=OPTIONS)
    controller = FakeController([Slot(0), Slot(1), Slot(2)])
    controller.set(0, 0.0, used=30, blocks=30, waiting=5, queued=10)  # the pair is pressed
    controller.set(1, 0.0, used=0, blocks=0)
    controller.set(2, 0.0, used=2, blocks=10)
    coordinator.after_step(controller)  # type: ignore[arg-type]
    triple = GroupPlan((0, 1, 2), balanced_slices(3, 8))
    assert groups.formed == [triple]  # the grow: 2 appended, 0 keeps leading
    assert controller.reassigned == [(1, 0), (2, 0)]
    # pressure falls: 12 blocks fit half of the pair's 30, but not yet for 5 s
    for now in (1.0, 2.0, 5.0):
        controller.set(0, now, used=12, blocks=45)
        coordinator.after_step(controller)  # type: ignore[arg-type]
    assert not groups.shrunk
    controller.set(0, 7.0, used=16, blocks=45)  # above 15: the window starts over
    coordinator.after_step(controller)  # type: ignore[arg-type]
    controller.set(0, 8.0, used=12, blocks=45)
    coordinator.after_step(controller)  # type: ignore[arg-type]
    assert not groups.shrunk
    controller.set(0, 13.0, used=12, blocks=45)
    coordinator.after_step(controller)  # type: ignore[arg-type]
    assert groups.shrunk == [0] and groups.groups() == [PAIR]
    assert coordinator.counters.num_shrinks == 1
    assert any(kind == "shrink" for _, kind, _ in coordinator.events)
    controller.set(0, 30.0, used=12, blocks=30)
    coordinator.after_step(controller)  # type: ignore[arg-type]
    assert groups.shrunk == [0]  # a pair restores whole, it never shrinks


def test_no_shrink_when_restores_are_off() -> None:
    triple = GroupPlan((0, 1, 2), balanced_slices(3, 8))
    groups = FakeGroups({0: triple})
    coordinator = KunServeCoordinator(groups, MEMORY, block_size=1, options=OPTIONS,
                                      restore=False)
    controller = FakeController([Slot(0), Slot(1), Slot(2)])
    for now in (0.0, 10.0, 20.0):
        controller.set(0, now, used=1, blocks=45)
        coordinator.after_step(controller)  # type: ignore[arg-type]
    assert not groups.shrunk and groups.groups() == [triple]


def test_a_triple_with_idle_dropped_memory_shrinks_by_one_before_restoring() -> None:
    # the idle rule (blocks in use fit 90% of the members' undropped pools for 2 s) is
    # due; 20 blocks fit the pair's 30 (within restore_fit) though not half of them, so
    # relief releases the last member instead of restoring every member at once
    options = MonitorOptions(check_interval=0.0, decode_tokens=0, min_group_seconds=1.0,
                             restore_window_seconds=0.0, idle_restore_seconds=2.0)
    triple = GroupPlan((0, 1, 2), balanced_slices(3, 8))
    groups = FakeGroups({0: triple})
    coordinator = KunServeCoordinator(groups, MEMORY, block_size=1, options=options)
    controller = FakeController([Slot(0), Slot(1), Slot(2)])
    for now in (0.0, 1.0, 2.5):
        controller.set(0, now, used=20, blocks=45)
        coordinator.after_step(controller)  # type: ignore[arg-type]
    assert groups.shrunk == [0] and groups.groups() == [PAIR]
    assert coordinator.counters.num_shrinks == 1 and coordinator.counters.num_restores == 0
    for now in (3.0, 4.0, 6.5):  # the pair, idle as long (15 fit 90% of 2 x 10), restores
        controller.set(0, now, used=15, blocks=30)
        coordinator.after_step(controller)  # type: ignore[arg-type]
    assert groups.groups() == [] and coordinator.counters.num_restores == 1


def test_an_idle_triple_whose_demand_the_pair_cannot_hold_restores_whole() -> None:
    options = MonitorOptions(check_interval=0.0, decode_tokens=0, min_group_seconds=1.0,
                             restore_window_seconds=0.0, idle_restore_seconds=2.0)
    # less weight per layer: 10 blocks alone, 22 as a pair, 30 as a triple
    memory = LayerMemory(num_layers=8, weight_bytes_per_layer=2, kv_block_bytes_per_layer=1,
                         kv_region_bytes=80)
    triple = GroupPlan((0, 1, 2), balanced_slices(3, 8))
    groups = FakeGroups({0: triple})
    coordinator = KunServeCoordinator(groups, memory, block_size=1, options=options)
    controller = FakeController([Slot(0), Slot(1), Slot(2)])
    for now in (0.0, 1.0, 2.5):  # 25 fit 90% of 3 x 10, not 90% of the pair's 22
        controller.set(0, now, used=25, blocks=30)
        coordinator.after_step(controller)  # type: ignore[arg-type]
    assert not groups.shrunk and coordinator.counters.num_restores == 1


def test_the_member_an_idle_shrink_releases_backs_off_as_after_an_idle_restore() -> None:
    options = MonitorOptions(check_interval=0.0, decode_tokens=0, min_group_seconds=1.0,
                             restore_window_seconds=0.0, idle_restore_seconds=2.0,
                             idle_backoff_seconds=30.0)
    groups = FakeGroups({0: GroupPlan((0, 1, 2), balanced_slices(3, 8))})
    coordinator = KunServeCoordinator(groups, MEMORY, block_size=1, options=options)
    controller = FakeController([Slot(0), Slot(1), Slot(2)])
    for now in (0.0, 1.0, 2.5):
        controller.set(0, now, used=20, blocks=45)
        coordinator.after_step(controller)  # type: ignore[arg-type]
    assert groups.groups() == [PAIR]
    controller.set(0, 3.0, used=30, blocks=30, waiting=5, queued=10)  # the pair is pressed
    controller.set(2, 3.0, used=2, blocks=10)
    coordinator.after_step(controller)  # type: ignore[arg-type]
    assert groups.formed == []  # instance 2 cannot grow straight back into it


@dataclass
class DeferredGroups(FakeGroups):
    """Shrinks at a later boundary (`boundary`), where the shrink can fail."""

    asked: list[int] = field(default_factory=list)

    def shrink_group(self, leader: int) -> bool:
        self.asked.append(leader)
        return True

    def boundary(self, carried_out: bool) -> None:
        for leader in self.asked:
            if carried_out:
                FakeGroups.shrink_group(self, leader)
        self.asked.clear()


def test_a_shrink_counts_when_carried_out_at_the_boundary_not_when_asked() -> None:
    options = MonitorOptions(check_interval=0.0, decode_tokens=0, min_group_seconds=1.0,
                             restore_window_seconds=0.0, idle_restore_seconds=2.0)
    for carried_out in (True, False):
        groups = DeferredGroups({0: GroupPlan((0, 1, 2), balanced_slices(3, 8))})
        coordinator = KunServeCoordinator(groups, MEMORY, block_size=1, options=options)
        controller = FakeController([Slot(0), Slot(1), Slot(2)])
        for now in (0.0, 1.0, 2.5):  # the idle shrink is asked for at 2.5
            controller.set(0, now, used=20, blocks=45)
            coordinator.after_step(controller)  # type: ignore[arg-type]
        assert groups.asked == [0] and coordinator.counters.num_shrinks == 0
        groups.boundary(carried_out)
        controller.set(0, 3.0, used=20, blocks=45 if not carried_out else 30)
        coordinator.after_step(controller)  # type: ignore[arg-type]
        assert coordinator.counters.num_shrinks == int(carried_out)
        assert [e[1] for e in coordinator.events].count("shrink") == int(carried_out)
