"""KunServe's exchange schedule (andante.cluster.kunserve.exchange), without torch: every
chunk handed out once, in order, within the budgets; a request is complete exactly when
its last chunk went; a gone request's chunks are skipped; the link load counts bytes
between members only."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.kunserve.adopt import KVMove
from andante.cluster.kunserve.exchange import Chunk, ExchangeQueue, chunks, link_load

moves_strategy = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 2),
                                    st.integers(0, 30), st.sampled_from([(0, 2), (2, 4)])),
                          max_size=40)


def _moves(raw: list[tuple[int, int, int, int, tuple[int, int]]]) -> list[KVMove]:
    return [KVMove(f"r{r}", src, block, dst, block + 100, layers)
            for r, src, dst, block, layers in raw]


@settings(max_examples=80, deadline=None)
@given(moves_strategy, st.integers(1, 5), st.lists(st.integers(1, 64), max_size=12),
       st.sets(st.integers(0, 4), max_size=2))
def test_every_chunk_once_within_budgets(raw, chunk_blocks, budgets, gone) -> None:  # type: ignore[no-untyped-def]
    moves = _moves(raw)
    queue = ExchangeQueue(moves, chunk_blocks)
    live = {f"r{r}" for r, *_ in raw} - {f"r{g}" for g in gone}
    copied: list[Chunk] = []

    def copy(chunk: Chunk) -> int:
        assert chunk.request_id in live
        copied.append(chunk)
        return 4 * len(chunk.src_blocks)

    complete: list[str] = []
    for budget in [*budgets, None]:
        before = len(copied)
        complete += queue.run(budget, live.__contains__, copy)
        spent = 4 * sum(len(c.src_blocks) for c in copied[before:])
        if budget is not None and len(copied) - before > 1:
            # a budget stops the run once spent (the last chunk may overrun it)
            assert spent - 4 * len(copied[-1].src_blocks) < budget
    assert queue.done and not queue.pending_ids()
    assert sorted(complete) == sorted(live & {m.request_id for m in moves})
    assert len(complete) == len(set(complete))
    expected = [(m.request_id, m.src_member, m.dst_member, m.layers, m.src_block, m.dst_block)
                for m in moves if m.request_id in live]
    got = [(c.request_id, c.src_member, c.dst_member, c.layers, s, d)
           for c in copied for s, d in zip(c.src_blocks, c.dst_blocks, strict=True)]
    assert sorted(got) == sorted(expected)  # every block of a live request, once
    assert all(len(c.src_blocks) <= chunk_blocks for c in copied)


def test_chunks_keep_request_order_and_cut_runs() -> None:
    moves = _moves([(1, 0, 1, b, (0, 2)) for b in range(5)] + [(0, 1, 0, 7, (2, 4))])
    cut = chunks(moves, 2)
    assert [(c.request_id, c.src_blocks) for c in cut] == [
        ("r1", [0, 1]), ("r1", [2, 3]), ("r1", [4]), ("r0", [7])]
    assert not any(c.local for c in cut)


def test_link_load_counts_the_busiest_member() -> None:
    moves = [KVMove("a", 0, 1, 1, 1, (0, 2)), KVMove("a", 0, 2, 2, 2, (0, 1)),
             KVMove("b", 1, 3, 1, 4, (0, 4))]  # the last one stays on member 1
    load = link_load(moves, block_bytes_per_layer=10)
    assert load.bytes_sent == 30 and load.busiest_bytes == 30  # member 0 sends 20 + 10
    assert link_load([], 10).busiest_bytes == 0
