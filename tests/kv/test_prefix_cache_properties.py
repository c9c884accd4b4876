"""Property test: with prefix caching, random schedules of admissions (with prefix
hits), computed steps, preemption by recompute, swaps, finishes and resizes conserve
blocks and reference counts, and a shared block only ever holds its holders' content."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import Request, SamplingParams
from andante.kv import KVBlockManager

PREFIXES = ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9, 9, 9, 9], [5] * 10)
OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "compute", "preempt", "swap_out", "swap_in", "finish",
                         "end_step", "resize"]),
        st.integers(min_value=0, max_value=5),  # which request
        st.integers(min_value=1, max_value=30),  # a count
    ),
    max_size=120,
)


class _World:
    """The scheduler's side: requests, what each holds, the calls it makes."""

    def __init__(self, kv: KVBlockManager) -> None:
        self.kv = kv
        self.requests: dict[str, Request] = {}
        self.allocated: dict[str, int] = {}  # device or host tokens covered

    def admit(self, rid: str, n: int) -> None:
        kv = self.kv
        req = self.requests.get(rid)
        if req is None:
            tokens = PREFIXES[n % 3] + [100 + n] * (n % 7)
            req = self.requests[rid] = Request(rid, tokens, SamplingParams(max_tokens=4), 0.0)
            kv.track(req)
        if kv.holds_kv(rid):
            return
        req.num_computed_tokens = kv.lookup_prefix(req)
        assert req.num_computed_tokens < req.num_tokens
        free_before = kv.num_free_device_blocks
        total = min(req.num_tokens, req.num_computed_tokens + n)
        if kv.allocate_slots(rid, total) is None:
            assert kv.num_free_device_blocks == free_before
            return
        assert kv.num_free_device_blocks >= kv.watermark_blocks
        self.allocated[rid] = total

    def compute(self, rid: str) -> None:
        """The step computed what was allocated; a finished prompt decodes one token."""
        req = self.requests.get(rid)
        if req is None or not self.kv.block_table(rid):
            return
        req.num_computed_tokens = self.allocated[rid]
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token(200 + req.num_tokens, 0.0)
        self.kv.cache_computed([req])
        target = req.num_tokens
        if self.kv.allocate_slots(rid, target) is not None:
            self.allocated[rid] = target

    def drop(self, rid: str, finished: bool) -> None:
        req = self.requests.get(rid)
        if req is None:
            return
        self.kv.free(rid)
        self.allocated.pop(rid, None)
        req.num_computed_tokens = 0
        if finished:
            self.kv.forget(rid)
            del self.requests[rid]

    def apply(self, op: str, rid: str, n: int) -> None:
        kv = self.kv
        if op == "admit":
            self.admit(rid, n)
        elif op == "compute":
            self.compute(rid)
        elif op in ("preempt", "finish"):
            self.drop(rid, finished=op == "finish")
        elif op == "swap_out" and kv.block_table(rid) and kv.can_swap_out(rid):
            kv.swap_out(rid)
        elif op == "swap_in" and kv.can_swap_in(rid):
            kv.swap_in(rid)
        elif op == "end_step":
            kv.end_step()
        elif op == "resize":
            self.resize(max(1, n))

    def resize(self, target: int) -> None:
        before = {r: list(self.kv.block_table(r)) for r in self.requests}
        moved = self.kv.resize_device(target)
        if moved is None:
            return
        for rid, table in before.items():
            assert self.kv.block_table(rid) == [moved.get(b, b) for b in table]

    def check(self) -> None:
        kv = self.kv
        kv.check_invariants()
        held = {b for rid in self.requests for b in kv.block_table(rid)}
        assert kv.num_free_device_blocks + len(held) == kv.num_device_blocks
        for rid, req in self.requests.items():
            table = kv.block_table(rid)
            if kv.holds_kv(rid):
                assert kv.num_blocks_of(rid) == kv.num_blocks_for(self.allocated[rid])
            hashes = kv._hashes[rid].upto(len(table))
            for j, block in enumerate(table):  # a cached block holds this very content
                if block in kv.cache.hash_of:
                    assert j < len(hashes) and kv.cache.hash_of[block] == hashes[j]
            assert req.num_computed_tokens <= max(req.num_tokens - 1, self.allocated.get(rid, 0))


@settings(max_examples=300, deadline=None)
@given(
    ops=OPS,
    num_device=st.integers(min_value=4, max_value=24),
    num_host=st.integers(min_value=0, max_value=16),
    block_size=st.sampled_from([1, 2, 4]),
    watermark=st.sampled_from([0.0, 0.1]),
)
def test_random_schedules_conserve_blocks_and_reference_counts(
    ops: list[tuple[str, int, int]], num_device: int, num_host: int, block_size: int,
    watermark: float,
) -> None:
    kv = KVBlockManager(block_size, num_device, num_host, watermark=watermark)
    world = _World(kv)
    for op, index, n in ops:
        world.apply(op, f"r{index}", n)
        world.check()
    kv.end_step()
    for rid in list(world.requests):
        world.drop(rid, finished=True)
    kv.check_invariants()
    assert kv.num_free_device_blocks == kv.num_device_blocks
    assert kv.num_free_host_blocks == num_host
    assert not kv.cache.refs  # every cached block is free (evictable) again
