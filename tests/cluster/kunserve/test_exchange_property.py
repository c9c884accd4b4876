"""KV exchange conserves blocks through random schedules (hypothesis property test)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.kunserve.adopt import adopt_group, kv_moves, whole_model
from andante.cluster.kunserve.plan import balanced_slices
from andante.cluster.kunserve.seam import GroupPlan
from tests.engine.helpers import make_engine, make_request

NUM_LAYERS = 6

request_sizes = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)),
                         min_size=0, max_size=8)


def _engine(prefix: str, sizes: list[tuple[int, int]], num_steps: int, num_blocks: int):
    engine, _, clock = make_engine("vllm", num_blocks, max_num_seqs=4)
    for i, (prompt, output) in enumerate(sizes):
        engine.submit(make_request(f"{prefix}{i}", prompt, output))
    for _ in range(num_steps):
        if not engine.has_work:
            break
        batch, result = engine.begin_step()
        clock.advance_to(clock.now() + result.duration)
        engine.finish_step(batch, result)
    return engine


@settings(max_examples=60, deadline=None)
@given(st.lists(request_sizes, min_size=2, max_size=3), st.integers(0, 12),
       st.integers(0, 40), st.sampled_from(["exchange", "recompute"]))
def test_adoption_conserves_blocks_and_requests(
        workloads: list[list[tuple[int, int]]], num_steps: int, extra_blocks: int,
        kv_mode: str) -> None:
    engines = [_engine(f"m{k}-", sizes, num_steps, 24) for k, sizes in enumerate(workloads)]
    schedulers = [e.scheduler for e in engines]
    leader = schedulers[0]
    before = {rid: (req, len(s.kv.block_table(rid)), req.status)
              for s in schedulers for rid, req in s.requests.items()}
    leader.kv.resize_device(leader.kv.num_device_blocks + extra_blocks)
    members = tuple(range(len(engines)))
    plan = GroupPlan(members, balanced_slices(len(members), NUM_LAYERS), kv_mode)  # type: ignore[arg-type]
    result = adopt_group([(s, whole_model(k, NUM_LAYERS)) for k, s in enumerate(schedulers)],
                         leader, plan)
    # every request is at the leader, once, in one of the three outcomes
    assert set(leader.requests) == set(before)
    assert result.num_requests == len(before)
    for s in schedulers[1:]:
        assert not s.requests and s.kv.num_free_device_blocks == s.kv.num_device_blocks
        s.kv.check_invariants()
    leader.kv.check_invariants()
    # conservation: an adopted request holds exactly as many blocks as it did; the
    # others hold none; used + free == total
    used = 0
    for rid in leader.requests:
        table = leader.kv.block_table(rid)
        used += len(table)
        if any(r.request_id == rid for r in result.adopted):
            assert len(table) == before[rid][1]
        else:
            assert table == []
    assert used + leader.kv.num_free_device_blocks == leader.kv.num_device_blocks
    # each adopted block of each layer arrives exactly once at the member holding it
    arrivals = [(m.request_id, m.dst_member, m.dst_block, layer)
                for m in result.moves for layer in range(*m.layers)]
    assert len(arrivals) == len(set(arrivals))
    for move in result.moves:
        start, end = plan.layer_slices[plan.members.index(move.dst_member)]
        assert start <= move.layers[0] < move.layers[1] <= end
    if kv_mode == "recompute":
        assert not result.moves and not result.adopted


@given(st.lists(st.integers(0, 50), min_size=1, max_size=6, unique=True),
       st.integers(1, 4), st.integers(1, 4))
def test_moves_then_moves_back_cover_every_layer(table: list[int], n_src: int,
                                                 n_dst: int) -> None:
    src = GroupPlan(tuple(range(n_src)), balanced_slices(n_src, NUM_LAYERS))
    dst = GroupPlan(tuple(range(10, 10 + n_dst)), balanced_slices(n_dst, NUM_LAYERS))
    new_table = [b + 100 for b in table]
    moves = kv_moves("r", src, table, dst, new_table)
    # disjoint members: every (block, layer) moves once
    assert sum(m.num_layers for m in moves) == len(table) * NUM_LAYERS
    assert not kv_moves("r", dst, new_table, dst, new_table)  # in place: nothing moves
