"""The evictable blocks of the prefix cache, least recently released first.

Design note (the order is vLLM v1's free-block queue, `vllm/v1/core/block_pool.py`:
a released table's blocks join the back, its last block first; eviction takes from the
front): a table lets go of hundreds of blocks at once and a prefix hit takes a run of
them back, so the order is kept as *segments*, one per release, in release order, with
lazy deletion (as a heap with stale entries). The prefix cache's per-block state list
(indexed by block id: a list read is several times cheaper than a dict probe on a big
table) holds -serial for an evictable block, the serial of the segment that released it
last; a segment's entry for a block is live only while that holds. Releasing and taking
back are list writes, never a linked-list node per block; eviction walks the front
segment past stale entries. When stale entries outnumber live ones the segments are
rebuilt, so memory stays proportional to the evictable blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

COMPACT_SLACK = 4096  # stale entries allowed beyond one per live block before a rebuild


class SegmentLRU:
    """The blocks whose state is negative, ordered by when they joined (oldest first).
    `state` is the prefix cache's per-block list, shared."""

    __slots__ = ("_head", "_num_entries", "_segments", "_serial", "num", "state")

    def __init__(self, state: list[int]) -> None:
        self.state = state
        self.num = 0  # blocks in the set
        self._segments: deque[tuple[int, list[int]]] = deque()  # (serial, blocks)
        self._head = 0  # entries of the front segment already taken
        self._serial = 0
        self._num_entries = 0  # entries in the segments, stale ones too

    @property
    def num_entries(self) -> int:
        """Entries in the segments, stale ones too."""
        return self._num_entries

    def __len__(self) -> int:
        return self.num

    def __contains__(self, block: int) -> bool:
        return self.state[block] < 0

    def __iter__(self) -> Iterator[int]:
        """The blocks, oldest first."""
        state, head = self.state, self._head
        for serial, blocks in self._segments:
            mark = -serial
            for block in blocks[head:] if head else blocks:
                if state[block] == mark:
                    yield block
            head = 0

    def push(self, blocks: list[int]) -> None:
        """Add `blocks` (none of them in the set) at the back, in this order."""
        if not blocks:
            return
        self._serial += 1
        mark, state = -self._serial, self.state
        for block in blocks:
            state[block] = mark
        self._segments.append((self._serial, blocks))
        self.num += len(blocks)
        self._num_entries += len(blocks)
        if self._num_entries > 2 * self.num + COMPACT_SLACK:
            self.compact()

    def pop_oldest(self, num: int) -> list[int]:
        """Take out the `num` oldest blocks (their state becomes 0); returns them,
        oldest first."""
        if num > self.num:
            raise KeyError(f"{num} blocks asked, {self.num} in the set")
        state, segments = self.state, self._segments
        taken: list[int] = []
        while len(taken) < num:
            serial, blocks = segments[0]
            mark, at, end = -serial, self._head, len(blocks)
            while at < end:
                block = blocks[at]
                at += 1
                if state[block] == mark:
                    state[block] = 0
                    taken.append(block)
                    if len(taken) == num:
                        break
            if at < end:
                self._head = at
            else:
                segments.popleft()
                self._head = 0
                self._num_entries -= end
        self.num -= num
        return taken

    def compact(self) -> None:
        """Rebuild the segments from the live entries, in order (one segment)."""
        live = list(self)
        self._serial += 1
        mark, state = -self._serial, self.state
        for block in live:
            state[block] = mark
        self._segments = deque([(self._serial, live)]) if live else deque()
        self._head = 0
        self._num_entries = len(live)

    def check(self) -> None:
        """Raises AssertionError if the segments do not hold each block once, live."""
        live = list(self)
        members = [b for b, s in enumerate(self.state) if s < 0]
        if len(live) != self.num or sorted(live) != members:
            raise AssertionError("prefix cache LRU: segments and blocks disagree")
