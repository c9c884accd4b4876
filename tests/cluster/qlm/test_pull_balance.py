"""What a QLM agent pulls at once, and a plan's assignment that the instances' state
has made stale (LSOs 1 and 4)."""

from __future__ import annotations

import zlib

from andante.cluster.instance import ModelState
from andante.cluster.qlm.eviction import Evictions
from andante.cluster.qlm.router import QLMRouter
from andante.core import SamplingParams, SyntheticTokens
from andante.core.request import Request
from andante.core.sampling import SLO
from tests.cluster.fakes import load_report, request
from tests.cluster.qlm.helpers import FakeModels, FakeSlot, model_state

GB = 10**9
PROMPT = 1000  # tokens of every queued request's prompt


def _state() -> ModelState:
    return model_state({"m1": 14 * GB}, bandwidth=2e9)


def _slot(index: int, running: int = 0, waiting: int = 0, unprefilled: int = 0) -> FakeSlot:
    """An instance with 256 batch slots and 160K tokens of KV; `unprefilled`: prompt
    tokens it holds not yet prefilled (its backlog)."""
    load = load_report(num_running=running, num_waiting=waiting, max_num_seqs=256,
                       num_blocks=10_000, num_free_blocks=10_000 - 8 * running, time=10.0,
                       num_uncomputed_tokens=running + unprefilled)
    return FakeSlot(load, FakeModels(_state()), index)


def _queue(n: int) -> list[Request]:
    return [request(f"r{i}", prompt=PROMPT) for i in range(n)]


def test_an_instance_pulls_only_what_it_can_start_at_its_next_step() -> None:
    """Where another instance serves the same model, one step's token budget (8,192
    prompt tokens by default) bounds a pull; an instance without a backlog took every
    request that fit its free slots before. An instance alone with its model takes
    all it has room for (it serves its model's queue before a swap)."""
    other = _slot(1, running=10, waiting=9, unprefilled=9000)  # m1 too, and full
    router = QLMRouter(plan=False)
    decision = router.dispatch(_queue(40), [_slot(0), other])
    assert dict(decision.placements).keys() and {i for _, i in decision.placements} == {0}
    assert len(decision.placements) == 8192 // PROMPT
    busy = QLMRouter(plan=False)  # half a step's prompts already wait to be prefilled
    decision = busy.dispatch(_queue(40), [_slot(0, running=10, waiting=4, unprefilled=4096),
                                          other])
    assert len(decision.placements) == 4096 // PROMPT
    full = QLMRouter(plan=False)
    decision = full.dispatch(_queue(40), [_slot(0, running=10, waiting=9, unprefilled=9000),
                                          other])
    assert decision.placements == ()
    wide = QLMRouter(plan=False, pull_tokens=100_000)
    assert len(wide.dispatch(_queue(40), [_slot(0), other]).placements) == 40
    alone = QLMRouter(plan=False)
    assert len(alone.dispatch(_queue(40), [_slot(0)]).placements) == 40


def test_a_stale_plan_assignment_goes_to_the_instance_that_can_pull() -> None:
    """A plan put every group on instance 1; since then instance 1 filled up (a step's
    prompts wait there) and instance 0 emptied: instance 0 pulls them, within its own
    budget. While instance 1 can pull, the plan's assignment holds."""
    router = QLMRouter(plan=False)
    queue = _queue(20)
    both_full = [_slot(0, running=40, waiting=9, unprefilled=9000),
                 _slot(1, running=40, waiting=9, unprefilled=9000)]
    assert router.dispatch(queue, both_full).placements == ()
    planned = {g.group_id: (1, pos) for pos, g in enumerate(router._groups())}
    router._order = dict(planned)
    decision = router.dispatch(queue, [_slot(0, running=5),
                                       _slot(1, running=80, waiting=9, unprefilled=9000)])
    assert {index for _, index in decision.placements} == {0}
    assert len(decision.placements) == 8192 // PROMPT
    rest = [r for r in queue if r.request_id not in dict(decision.placements)]
    router._order = {g.group_id: (1, pos) for pos, g in enumerate(router._groups())}
    decision = router.dispatch(rest, [_slot(0, running=5), _slot(1, running=5)])
    # both can pull: the plan's assignment holds
    assert decision.placements and {index for _, index in decision.placements} == {1}


def test_without_load_balancing_a_model_keeps_its_static_instance() -> None:
    """The "- load balancing" ablation: each model on one instance by a hash of its name;
    a re-balance to the instance that can pull would make it dynamic again."""
    static = zlib.crc32(b"m1") % 2
    for busy in (0, 1):  # whichever instance is full, the model stays on its own one
        router = QLMRouter(plan=False, load_balance=False)
        slots = [_slot(i, running=80, waiting=9, unprefilled=9000) if i == busy
                 else _slot(i, running=5) for i in (0, 1)]
        where = {index for _, index in router.dispatch(_queue(20), slots).placements}
        assert where == (set() if busy == static else {static})


def _upstream(index: int, running: int, waiting: int) -> FakeSlot:
    """An upstream server's slot: counts of requests, no token counts (its stats leave
    num_uncomputed_tokens at 0: andante.runtime.upstream.instance)."""
    load = load_report(num_running=running, num_waiting=waiting, max_num_seqs=256,
                       num_blocks=10_000, num_free_blocks=5_000, time=10.0)
    assert load.stats.num_uncomputed_tokens == 0
    return FakeSlot(load, FakeModels(_state()), index)


def test_an_upstream_with_a_waiting_queue_pulls_nothing() -> None:
    """Without token counts, a waiting request is a backlog (the gate before the prompt-
    token bound); an upstream with none waiting pulls one step's prompt tokens."""
    agents = QLMRouter(plan=False).agents
    assert agents.pull_room(_upstream(0, running=10, waiting=30)) == (0, 0)
    assert agents.pull_room(_upstream(0, running=10, waiting=0)) == (246, 8192)
    router = QLMRouter(plan=False)
    decision = router.dispatch(_queue(40), [_upstream(0, running=10, waiting=30),
                                            _upstream(1, running=10, waiting=0)])
    assert {index for _, index in decision.placements} == {1}
    full = QLMRouter(plan=False)
    both = [_upstream(0, running=10, waiting=30), _upstream(1, running=10, waiting=30)]
    assert full.dispatch(_queue(40), both).placements == ()


def _due(rid: str, deadline: float) -> Request:
    return Request(rid, SyntheticTokens(PROMPT), SamplingParams(max_tokens=8, ignore_eos=True),
                   0.0, slo=SLO(deadline=deadline))


def test_a_moved_group_ranks_after_the_targets_plan_and_evicts_nothing(monkeypatch) -> None:
    """A group re-balanced off its planned instance keeps no position of that plan: it
    ranks after the target's own planned groups, and as the target's head it is not a
    new head that evicts running requests (LSO 2) for a group only moved."""
    queue = [_due(f"a{i}", 20.0) for i in range(2)] + [_due(f"b{i}", 40.0) for i in range(2)]
    full = [_slot(0, running=40, waiting=9, unprefilled=9000),
            _slot(1, running=40, waiting=9, unprefilled=9000)]
    free = [_slot(0, running=5), full[1]]  # instance 1 cannot pull, instance 0 can
    heads: list[str] = []
    for plan in ("both", "one"):
        router = QLMRouter(plan=False)
        assert router.dispatch(queue, full).placements == ()
        a, b = sorted(router._groups(), key=lambda g: g.deadline)
        # instance 1's plan has `a` first; instance 0's own plan has `b` (or nothing)
        router._order = {a.group_id: (1, 0), b.group_id: (0, 3) if plan == "both" else (1, 1)}
        router.agents.last_head.clear()
        monkeypatch.setattr(router.agents, "evict_for_head",
                            lambda inst, head, *_: heads.append(head.group_id) or Evictions(
                                outcome="fits"))
        placed = [rid for rid, index in router.dispatch(queue, free).placements if index == 0]
        if plan == "both":  # b is instance 0's planned head; a (moved) after it
            assert placed == ["b0", "b1", "a0", "a1"] and heads == [b.group_id]
        else:  # every group moved: no eviction check for the moved head
            assert sorted(placed) == ["a0", "a1", "b0", "b1"] and heads == [b.group_id]
