"""The performance model's sliding window of (step shape, duration) samples.

Design note (Ascendra §5.1: the model is refitted on recent steps). The window holds
the last `maxlen` steps. A decode run's steps differ only by their context (each sequence
one token longer per step, `BatchShape.advance_decodes`), so a run is kept as one part,
its first shape and its durations, and its samples are built only when the window is
read (at a refit, rarely once the model fits): a simulated decode run then costs the
window O(1) instead of one shape per step. Reading gives exactly the samples appending
each step would have kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from andante.perf.fit import Sample
from andante.perf.shape import BatchShape

# a part: (first shape, durations, index of its first kept step)
_Part = tuple[BatchShape, Sequence[float], int]


class SampleWindow:
    """The last `maxlen` samples, decode runs kept compact (see the module note)."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._parts: deque[_Part] = deque()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, sample: Sample) -> None:
        shape, duration = sample
        self._add((shape, (duration,), 0), 1)

    def append_decode_run(self, shape: BatchShape, durations: Sequence[float]) -> None:
        """The samples of steps lasting `durations`, the first of `shape` and each next
        one with every sequence one token longer."""
        count = len(durations)
        first = max(0, count - self.maxlen)  # older ones would drop out at once
        if first < count:
            self._add((shape, durations, first), count - first)

    def _add(self, part: _Part, count: int) -> None:
        self._parts.append(part)
        self._len += count
        while self._len > self.maxlen:  # drop the oldest steps
            shape, durations, first = self._parts[0]
            drop = min(self._len - self.maxlen, len(durations) - first)
            if first + drop == len(durations):
                self._parts.popleft()
            else:
                self._parts[0] = (shape, durations, first + drop)
            self._len -= drop

    def __iter__(self) -> Iterator[Sample]:
        for shape, durations, first in self._parts:
            if len(durations) == 1 and first == 0:
                yield shape, durations[0]
                continue
            n, tokens, sampled = shape.num_seqs, shape.num_tokens, shape.num_sampled
            decodes, pairs, kv = shape.num_decode_seqs, shape.attn_pairs, shape.kv_tokens_read
            for step in range(first, len(durations)):
                yield BatchShape(n, tokens, sampled, decodes, pairs + step * n,
                                 kv + step * n), durations[step]
