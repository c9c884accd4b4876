"""Invariants of Figure 6's drop plan over random clusters of solos and formed groups
(KunServe §4.1): no member in two groups, every unit merged whole or left alone, the
freed memory accounted exactly, and a formed group that a smaller unit joins keeps its
leader (the grow of a formed group)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.kunserve.plan import (
    GroupState,
    LayerMemory,
    balanced_slices,
    drop_plan,
    merged,
)
from andante.cluster.kunserve.seam import GroupPlan

MEMORY = LayerMemory(num_layers=8, weight_bytes_per_layer=10, kv_block_bytes_per_layer=1,
                     kv_region_bytes=80)


@st.composite
def clusters(draw: st.DrawFn) -> list[GroupState]:
    """Units over instances 0..n-1: groups of 1-4 consecutive members, random pressure."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    units, index = [], 0
    for size in sizes:
        members = tuple(range(index, index + size))
        index += size
        plan = GroupPlan(members, balanced_slices(size, MEMORY.num_layers))
        units.append(GroupState(plan, draw(st.integers(0, 40))))
    return units


@settings(max_examples=200, deadline=None)
@given(units=clusters(), demand=st.integers(0, 200), cap=st.none() | st.integers(2, 8))
def test_drop_plan_invariants(units: list[GroupState], demand: int, cap: int | None) -> None:
    plan = drop_plan(units, demand, MEMORY, cap)
    seen: set[int] = set()
    freed = 0
    for group in plan.groups:
        assert not seen & set(group.members), "a member in two groups"
        seen |= set(group.members)
        assert group.layer_slices == balanced_slices(len(group.members), MEMORY.num_layers)
        inside = [u.plan for u in units if set(u.plan.members) & set(group.members)]
        assert all(set(p.members) <= set(group.members) for p in inside), "a unit split"
        assert sum(len(p.members) for p in inside) == len(group.members)
        assert len(inside) >= 2 and len(group.members) <= min(cap or 8, 8)
        freed += MEMORY.group_blocks(group) - sum(MEMORY.group_blocks(p) for p in inside)
        for p in inside:  # a unit bigger than the rest of the group keeps leading it
            if 2 * len(p.members) > len(group.members):
                assert group.leader == p.leader
    assert freed == plan.freed_blocks  # memory accounting conserved


def test_a_solo_joining_a_formed_group_keeps_its_leader_first() -> None:
    pair = GroupPlan((3, 5), balanced_slices(2, 8))
    solo = GroupPlan((1,), ((0, 8),))
    assert merged(solo, pair, 8).members == (3, 5, 1)
    assert merged(pair, solo, 8).members == (3, 5, 1)
    assert merged(GroupPlan((0,), ((0, 8),)), solo, 8).members == (0, 1)


def test_the_pressed_solo_joins_the_formed_group_without_leading_it() -> None:
    pair = GroupState(GroupPlan((0, 1), balanced_slices(2, 8)), pressure=3)
    plan = drop_plan([pair, GroupState(GroupPlan((2,), ((0, 8),)), 30)], 20, MEMORY)
    assert [g.members for g in plan.groups] == [(0, 1, 2)]
