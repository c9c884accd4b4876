"""KunServe's pipeline-group state machine (andante.cluster.kunserve.groups) on a fake
site: which plans it takes, the order of a formation's and a restore's steps, a restore
that waits for room, and the eviction of a failed group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from andante.cluster.kunserve.adopt import Adoption, KVMove
from andante.cluster.kunserve.groups import PipelineGroupBook, evict_group, moves_back, shed
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import Request, RequestStatus
from andante.engine.engine import Engine
from andante.engine.scheduler import Scheduler
from tests.engine.helpers import make_engine, make_request

LAYERS = 4
HALVES = GroupPlan((0, 1), ((0, 2), (2, 4)))


def _running_engine(prefix: str, num: int, blocks: int = 64) -> Engine:
    engine, _, clock = make_engine("vllm", blocks, max_num_seqs=8)
    for i in range(num):
        engine.submit(make_request(f"{prefix}{i}", 8, 20))
    for _ in range(3):
        batch, result = engine.begin_step()
        clock.advance_to(clock.now() + result.duration)
        engine.finish_step(batch, result)
    return engine


@dataclass
class FakeSite:
    engines: list[Engine]
    joinable: set[int] = field(default_factory=lambda: {0, 1, 2, 3})
    room: bool = True
    calls: list[str] = field(default_factory=list)
    moved: dict[int, list[str]] = field(default_factory=dict)
    moves: list[KVMove] = field(default_factory=list)

    def scheduler(self, index: int) -> Scheduler:
        return self.engines[index].scheduler

    def can_join(self, index: int, pending: bool) -> bool:
        return index in self.joinable and index < len(self.engines)

    def group_blocks(self, plan: GroupPlan) -> int:
        return 100

    def resize(self, index: int, num_blocks: int) -> None:
        self.calls.append(f"resize {index} {num_blocks}")
        self.scheduler(index).kv.resize_device(num_blocks)

    def join(self, plan: GroupPlan, moved: Mapping[int, list[Request]]) -> None:
        self.calls.append("join")
        self.moved = {m: [r.request_id for r in reqs] for m, reqs in moved.items()}

    def exchange(self, plan: GroupPlan, moves: list[KVMove], adoption: Adoption | None
                 ) -> None:
        self.calls.append("exchange form" if adoption is not None else "exchange back")
        self.moves = moves

    def settle(self, plan: GroupPlan, lost: bool) -> None:
        self.calls.append(f"settle lost={lost}")

    def make_room(self, plan: GroupPlan, failed: int | None) -> bool:
        self.calls.append("make_room")
        return self.room

    def leave(self, plan: GroupPlan, failed: int | None) -> None:
        self.calls.append(f"leave failed={failed}")

    def shrink_to(self, plan: GroupPlan, smaller: GroupPlan, moves: list[KVMove]) -> None:
        self.calls.append("shrink_to")
        self.moves = moves


def _book(num: int = 3, merges: bool = True) -> tuple[PipelineGroupBook, FakeSite]:
    site = FakeSite([_running_engine(f"i{k}-", 2) for k in range(num)])
    return PipelineGroupBook(site, LAYERS, merges), site


def test_form_runs_its_steps_in_order_and_the_leader_owns_every_request() -> None:
    book, site = _book()
    assert book.propose(HALVES) == [0, 1] and book.pending == [HALVES]
    assert book.units_of(GroupPlan((2, 1), ((0, 2), (2, 4)))) is None  # 1 is waiting
    adoption = book.form(HALVES)
    assert adoption is not None and not book.pending
    assert site.calls == ["resize 0 100", "join", "exchange form"]
    assert site.moved == {1: ["i1-0", "i1-1"]}
    assert set(site.scheduler(0).requests) == {"i0-0", "i0-1", "i1-0", "i1-1"}
    assert not site.scheduler(1).requests
    assert len(adoption.adopted) == 4 and site.moves == adoption.moves
    assert book.plans() == [HALVES] and book.leader_of(1) == 0
    assert not book.accepting(1) and book.accepting(0) and book.accepting(2)


def test_plans_it_refuses() -> None:
    book, site = _book(merges=False)
    site.joinable.discard(2)
    assert book.units_of(GroupPlan((0,), ((0, 4),))) is None  # one member
    assert book.units_of(GroupPlan((0, 1), ((0, 1), (1, 3)))) is None  # 3 of 4 layers
    assert book.units_of(GroupPlan((0, 2), ((0, 2), (2, 4)))) is None  # 2 cannot join
    book.propose(HALVES)
    book.form(HALVES)
    site.joinable.add(2)
    three = GroupPlan((0, 1, 2), ((0, 1), (1, 2), (2, 4)))
    assert book.units_of(GroupPlan((2, 1), ((0, 2), (2, 4)))) is None  # splits 0-1
    assert book.is_grow(three) and book.units_of(three) == [0, 2]  # a grow: 0-1 and 2
    assert book.units_of(GroupPlan((2, 0, 1), ((0, 1), (1, 2), (2, 4)))) is None  # 2 leads
    assert book.units_of(GroupPlan((0, 2, 1), ((0, 1), (1, 2), (2, 4)))) is None  # reorders
    book.grows = False
    assert book.units_of(three) is None  # no merging here
    book.merges = True
    assert book.units_of(three) == [0, 2]  # the group 0-1 and instance 2


def test_restore_waits_for_room_then_moves_back_and_leaves() -> None:
    book, site = _book()
    book.propose(HALVES)
    book.form(HALVES)
    assert book.ask_restore(0) is HALVES and book.ask_restore(0) is None
    site.calls.clear()
    site.room = False
    assert not book.restore(HALVES) and book.plans() == [HALVES]
    site.room = True
    assert book.restore(HALVES)
    assert site.calls == ["settle lost=False", "make_room", "settle lost=False", "make_room",
                          "exchange back", "leave failed=None"]
    assert not book.plans() and not book.restoring and book.accepting(1)
    running = site.scheduler(0).running
    assert site.moves == moves_back(HALVES, site.scheduler(0)) and len(running) == 4
    # every layer of every block of each running request comes back to the leader
    assert {m.dst_member for m in site.moves} == {0} and {m.layers for m in site.moves} == {
        (2, 4)}
    assert not book.restore(HALVES)  # gone


def test_a_new_plan_calls_off_a_restore_and_a_dropped_group_is_forgotten() -> None:
    book, site = _book(4)
    book.propose(HALVES)
    book.form(HALVES)
    book.ask_restore(0)
    bigger = GroupPlan((0, 1, 2), ((0, 1), (1, 2), (2, 4)))
    assert book.propose(bigger) == [0, 2] and not book.restoring
    assert book.ask_restore(0) is None  # a formation waits on it
    book.form(bigger)
    assert book.plans() == [bigger]
    assert book.drop(0) is bigger and not book.plans() and book.drop(0) is None


def test_evict_and_shed() -> None:
    engine = _running_engine("a", 3)
    scheduler = engine.scheduler
    started = [r for r in scheduler.requests.values() if r.num_output_tokens]
    requeue, failed = evict_group(scheduler, 5.0, failed=1)
    assert not scheduler.requests and {r.request_id for r in failed} == {
        r.request_id for r in started} and not requeue
    assert all(r.status == RequestStatus.FINISHED_ABORTED
               and "instance 1" in (r.timeline.rejection_reason or "") for r in failed)
    engine = _running_engine("b", 4)
    scheduler = engine.scheduler
    used = scheduler.kv.num_device_blocks - scheduler.kv.num_free_device_blocks
    assert shed(scheduler, used - 1, everything=False, now=1.0) >= 1
    assert scheduler.kv.num_device_blocks - scheduler.kv.num_free_device_blocks <= used - 1
    num_running = len(scheduler.running)
    assert shed(scheduler, 10**6, everything=True, now=1.0) == num_running > 0
    assert not scheduler.running  # all re-queued for recompute
    scheduler.kv.check_invariants()
