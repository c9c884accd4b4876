"""Figure 6's drop plan on small clusters whose answer is known; the monitor's trigger."""

from __future__ import annotations

import pytest

from andante.cluster.kunserve.monitor import MonitorOptions, unmet_demand
from andante.cluster.kunserve.plan import (
    GroupState,
    LayerMemory,
    balanced_slices,
    drop_plan,
)
from andante.cluster.kunserve.seam import GroupPlan
from andante.engine.stats import SchedulerStats

# 8 layers of 10 units of weights; a block of one layer is 1 unit; 80 units of KV:
# a whole instance has 80 // 8 = 10 blocks; a half (4 layers) 120 // 4 = 30 blocks.
MEMORY = LayerMemory(num_layers=8, weight_bytes_per_layer=10, kv_block_bytes_per_layer=1,
                     kv_region_bytes=80)


def solo(index: int, pressure: int = 0) -> GroupState:
    return GroupState(GroupPlan((index,), ((0, 8),)), pressure)


def test_capacity_arithmetic() -> None:
    assert MEMORY.num_blocks_whole == 10
    pair = GroupPlan((0, 1), balanced_slices(2, 8))
    assert MEMORY.group_blocks(pair) == 30  # (80 + 4*10) // 4
    quad = GroupPlan((0, 1, 2, 3), balanced_slices(4, 8))
    assert MEMORY.group_blocks(quad) == 70  # (80 + 6*10) // 2
    assert MEMORY.dropped_weight_bytes(pair) == 80


def test_balanced_slices_are_contiguous_and_cover() -> None:
    assert balanced_slices(3, 8) == ((0, 3), (3, 6), (6, 8))
    with pytest.raises(ValueError):
        balanced_slices(9, 8)


def test_no_demand_no_plan() -> None:
    plan = drop_plan([solo(0), solo(1)], 0, MEMORY)
    assert plan.groups == () and plan.satisfied


def test_one_pair_suffices_and_the_pressed_instance_is_in_it() -> None:
    # demand 5 blocks: one pair frees 30 - 20 = 10
    plan = drop_plan([solo(0), solo(1), solo(2, pressure=5), solo(3)], 5, MEMORY)
    assert plan.satisfied and plan.freed_blocks == 10
    assert len(plan.groups) == 1 and plan.groups[0].members[0] == 2
    assert plan.groups[0].layer_slices == ((0, 4), (4, 8))


def test_fewest_members_first_two_pairs_before_a_quad() -> None:
    # demand 15: the first pair frees 10, the second pair 10 more
    plan = drop_plan([solo(i) for i in range(4)], 15, MEMORY)
    assert plan.satisfied and plan.freed_blocks == 20
    assert sorted(len(g.members) for g in plan.groups) == [2, 2]


def test_pairs_merge_into_a_quad_when_needed() -> None:
    # demand 50: two pairs free 20, merging them (70 - 60) 10 more: 30 < 50 unsatisfied
    plan = drop_plan([solo(i) for i in range(4)], 50, MEMORY)
    assert [len(g.members) for g in plan.groups] == [4]
    assert plan.freed_blocks == 30 and not plan.satisfied  # -> scale-up signal


def test_max_members_caps_the_groups() -> None:
    plan = drop_plan([solo(i) for i in range(4)], 50, MEMORY, max_members=2)
    assert sorted(len(g.members) for g in plan.groups) == [2, 2] and not plan.satisfied


def test_a_single_instance_has_no_plan() -> None:
    plan = drop_plan([solo(0, 3)], 3, MEMORY)
    assert plan.groups == () and not plan.satisfied


def test_throttle_on_projected_demand() -> None:
    options = MonitorOptions(drop_threshold=1.0, decode_tokens=16)
    busy = SchedulerStats(num_running=4, num_waiting=2, num_free_blocks=10, num_blocks=100,
                          num_queued_kv_blocks=8)
    # used 90 + queued 8 + growth ceil(4*16/16)=4 -> 102 > 100
    assert unmet_demand(busy, 16, options) == 2
    calm = SchedulerStats(num_running=4, num_waiting=2, num_free_blocks=30, num_blocks=100,
                          num_queued_kv_blocks=8)
    assert unmet_demand(calm, 16, options) == 0
    nothing_waits = SchedulerStats(num_running=4, num_free_blocks=0, num_blocks=100)
    assert unmet_demand(nothing_waits, 16, options) == 0
    early = MonitorOptions(drop_threshold=0.8, decode_tokens=16)
    assert unmet_demand(calm, 16, early) == 2  # 82 > 80: acts before the queue builds
