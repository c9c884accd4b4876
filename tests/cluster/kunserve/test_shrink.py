"""KunServe's "shrink by one" (andante.cluster.kunserve.shrink): which member goes,
when the smaller group fits, the restore window, and the book's step at a boundary."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.kunserve.monitor import MonitorOptions, projected_demand
from andante.cluster.kunserve.plan import LayerMemory, balanced_slices
from andante.cluster.kunserve.seam import GroupPlan
from andante.cluster.kunserve.shrink import ShrinkWatch, shrink_fits, shrunk
from andante.engine.stats import SchedulerStats
from tests.cluster.kunserve.test_group_book import _book

MEMORY = LayerMemory(num_layers=8, weight_bytes_per_layer=10, kv_block_bytes_per_layer=1,
                     kv_region_bytes=80)
OPTIONS = MonitorOptions(decode_tokens=16, queue_horizon_tokens=0)


def _group(size: int, first: int = 0) -> GroupPlan:
    return GroupPlan(tuple(range(first, first + size)), balanced_slices(size, 8))


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 8), used=st.integers(0, 80), queued=st.integers(0, 40),
       running=st.integers(0, 20), waiting=st.integers(0, 3))
def test_shrink_invariants(size: int, used: int, queued: int, running: int,
                           waiting: int) -> None:
    plan = _group(size, first=3)
    blocks = MEMORY.group_blocks(plan)
    stats = SchedulerStats(num_running=running, num_waiting=waiting, num_blocks=blocks,
                           num_free_blocks=max(0, blocks - used), num_queued_kv_blocks=queued)
    smaller = shrunk(plan)
    if size < 3:  # a pair restores whole; a solo has nothing to release
        assert smaller is None and not shrink_fits(plan, stats, MEMORY, 16, OPTIONS)
        return
    assert smaller is not None
    assert smaller.members == plan.members[:-1] and smaller.leader == plan.leader
    assert plan.members[-1] not in smaller.members  # no member in two groups
    assert smaller.layer_slices == balanced_slices(size - 1, 8)
    assert MEMORY.group_blocks(smaller) <= blocks  # a shrink gives memory back
    fits = shrink_fits(plan, stats, MEMORY, 16, OPTIONS)
    demand = projected_demand(stats, 16, OPTIONS.decode_tokens)
    assert fits == (demand <= OPTIONS.restore_threshold * MEMORY.group_blocks(smaller))
    if fits:  # what the group holds fits the smaller one, with room to spare
        assert blocks - stats.num_free_blocks <= MEMORY.group_blocks(smaller)


def test_the_watch_waits_for_the_window_and_the_group_age() -> None:
    options = MonitorOptions(min_group_seconds=2.0, restore_window_seconds=5.0)
    watch, plan = ShrinkWatch(), _group(3)
    assert not watch.due(plan, True, 0.0, options)
    assert not watch.due(plan, True, 4.0, options)
    assert not watch.due(plan, False, 4.5, options)  # the fit broke: the window restarts
    assert not watch.due(plan, True, 6.0, options)
    assert watch.due(plan, True, 11.0, options)
    watch.forget(plan.leader)
    assert not watch.due(plan, True, 11.0, options)  # a changed group starts over


def test_the_book_shrinks_a_group_at_a_boundary() -> None:
    book, site = _book(4)
    three = _group(3)
    three = GroupPlan(three.members, balanced_slices(3, 4))
    book.propose(three)
    book.form(three)
    assert book.shrink(1) is None  # no group led by 1
    site.calls.clear()
    smaller = book.shrink(0)
    assert smaller is not None and smaller.members == (0, 1)
    assert site.calls == ["settle lost=False", "resize 0 100", "shrink_to"]
    assert book.plans() == [smaller] and book.leader_of(2) is None and book.accepting(2)
    # the released member's layers (3, 4) move to member 1, which holds (2, 4) now
    assert site.moves and {(m.src_member, m.dst_member, m.layers) for m in site.moves} == {
        (2, 1, (3, 4))}
    assert book.shrink(0) is None  # a pair restores whole instead


def test_the_book_refuses_a_shrink_whose_blocks_do_not_fit() -> None:
    book, site = _book(3)
    three = GroupPlan((0, 1, 2), balanced_slices(3, 4))
    book.propose(three)
    book.form(three)
    site.group_blocks = lambda plan: 1  # type: ignore[method-assign]
    assert book.shrink(0) is None and book.plans() == [three]
