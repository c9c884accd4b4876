"""One tier of fixed-size KV blocks: a free list with O(1) allocate and free."""

from __future__ import annotations


class OutOfBlocksError(RuntimeError):
    """Raised when a tier is asked for more blocks than it has free (a caller bug)."""


class BlockPool:
    """Block ids 0..num_blocks-1 of one tier (device or host)."""

    def __init__(self, name: str, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"{name}: num_blocks must be >= 0, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        # Reversed so that low ids come out first: deterministic, cache-friendly.
        self._free_ids: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free_ids)

    def allocate(self, num: int) -> list[int]:
        if num > len(self._free_ids):
            raise OutOfBlocksError(f"{self.name}: asked for {num} blocks, {self.num_free} free")
        if num <= 0:
            return []
        taken = self._free_ids[-num:]
        del self._free_ids[-num:]
        taken.reverse()
        return taken

    def free(self, block_ids: list[int]) -> None:
        self._free_ids.extend(reversed(block_ids))

    def free_reuse_last(self, block_ids: list[int]) -> None:
        """Free blocks that later allocations should take only when nothing else is free
        (blocks still being copied to the other tier by an asynchronous swap)."""
        self._free_ids[:0] = reversed(block_ids)

    def take(self, block_ids: list[int]) -> None:
        """Allocate these particular free blocks."""
        wanted = set(block_ids)
        kept = [b for b in self._free_ids if b not in wanted]
        if len(self._free_ids) - len(kept) != len(wanted):
            raise OutOfBlocksError(f"{self.name}: some of the blocks asked for are not free")
        self._free_ids = kept

    def grow(self, num: int) -> None:
        """Add `num` new block ids at the top of the range (memory given to this tier)."""
        if num < 0:
            raise ValueError(f"{self.name}: cannot grow by {num} blocks")
        new = range(self.num_blocks + num - 1, self.num_blocks - 1, -1)
        self._free_ids[:0] = new  # taken after the existing free blocks
        self.num_blocks += num

    def shrink_to(self, num_blocks: int) -> None:
        """Drop ids >= `num_blocks`; every one of them must be free (caller relocates)."""
        if not 0 <= num_blocks <= self.num_blocks:
            raise ValueError(f"{self.name}: cannot shrink {self.num_blocks} to {num_blocks}")
        kept = [b for b in self._free_ids if b < num_blocks]
        if len(self._free_ids) - len(kept) != self.num_blocks - num_blocks:
            raise OutOfBlocksError(f"{self.name}: blocks >= {num_blocks} are still in use")
        self._free_ids = kept
        self.num_blocks = num_blocks

    def free_ids(self) -> list[int]:
        """A copy of the free list (for invariant checks)."""
        return list(self._free_ids)
