"""The chunked KV exchange: whatever the chunk size and per-step budgets, every request's
KV lands intact on the member holding each layer, nothing else is written, and every
byte is counted once."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.kunserve.adopt import kv_moves, whole_model
from andante.cluster.kunserve.seam import GroupPlan
from andante.exec.torch_pipeline_kv import LayerPool
from andante.kv.block_manager import KVBlockManager
from andante.runtime.kunserve_stages import KVExchange

LAYERS, HEADS, BLOCK, DIM = 4, 2, 2, 3
OLD, GROUP = 32, 80  # blocks of each member before, of the group after
PLAN = GroupPlan((0, 1), ((0, 1), (1, 4)))


def _pool(num_layers: int, num_blocks: int) -> torch.Tensor:
    return torch.zeros(num_layers, HEADS, num_blocks, BLOCK, DIM)


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 4)), min_size=1,
                      max_size=6),
       chunk_blocks=st.integers(1, 5), budgets=st.lists(st.integers(1, 400), max_size=20),
       gone=st.sets(st.integers(0, 5), max_size=2))
def test_exchange_moves_every_block_once(sizes, chunk_blocks, budgets, gone) -> None:  # type: ignore[no-untyped-def]
    old = {m: KVBlockManager(BLOCK, OLD) for m in (0, 1)}  # old[0] becomes the group's
    old_pools = {m: torch.randn(LAYERS, HEADS, OLD, BLOCK, DIM) for m in (0, 1)}
    src_tables = {f"r{i}": old[m].allocate(f"r{i}", n * BLOCK)
                  for i, (m, n) in enumerate(sizes)}
    group = old[0]
    group.resize_device(GROUP)  # the leader's own requests keep their block ids
    moves, tables = [], {}
    for i, (member, num_blocks) in enumerate(sizes):
        rid = f"r{i}"
        src = src_tables[rid]
        dst = src if member == 0 else group.allocate(rid, num_blocks * BLOCK)
        tables[rid] = (member, src, dst)
        moves += kv_moves(rid, whole_model(member, LAYERS), src, PLAN, dst)
    targets = {0: _pool(1, GROUP), 1: _pool(3, GROUP)}
    targets[0][:, :, :OLD] = old_pools[0][0:1]  # each member's kept layers, in bulk
    targets[1][:, :, :OLD] = old_pools[1][1:4]
    exchange = KVExchange(moves, {m: LayerPool(p) for m, p in old_pools.items()},
                          {0: LayerPool(targets[0], 0), 1: LayerPool(targets[1], 1)},
                          chunk_blocks)
    live = {f"r{i}" for i in range(len(sizes))} - {f"r{i}" for i in gone}
    complete: list[str] = []
    for budget in budgets:
        complete += exchange.run(budget, live.__contains__)
    complete += exchange.run(None, live.__contains__)
    assert exchange.done and sorted(complete) == sorted(live & set(tables))
    layer_bytes = HEADS * BLOCK * DIM * 4
    expected = {"link": 0, "local": 0}
    for rid, (member, src, dst) in tables.items():
        if rid not in live:
            continue
        for layer in range(LAYERS):
            holder = 0 if layer == 0 else 1
            pool = LayerPool(targets[holder], 0 if holder == 0 else 1)
            got = pool.layers(layer, layer + 1)[:, :, dst]
            assert torch.equal(got, old_pools[member][layer:layer + 1, :, src])
            if holder != member:
                expected["link"] += len(src) * layer_bytes
            else:  # a slot already in place came with the bulk copy
                moved = sum(s != d for s, d in zip(src, dst, strict=True))
                expected["local"] += moved * layer_bytes
    assert exchange.bytes_exchanged == expected["link"]
    assert exchange.bytes_local == expected["local"]
    used = {b for _, _, dst in tables.values() for b in dst}
    free = [b for b in range(OLD, GROUP) if b not in used]
    assert not targets[1][:, :, free].any()  # nothing written outside the tables
    group.check_invariants()
