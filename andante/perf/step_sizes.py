"""The first step of a new size: what a CPU engine pays once per token count.

Design note. The real engine's GEMMs are oneDNN primitives (andante.exec.torch_layers),
and oneDNN builds, JIT-compiles and caches one primitive per input shape: every step
whose token count T is new to the process creates the five projections of a layer at
M = T (plus the attention kernels' tiles), and the primitive cache is an LRU of 1,024
entries (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`). Measured here (SmolLM2-135M, bf16, one
thread, process CPU time, `ONEDNN_VERBOSE=2`): a 200-token prefill ran 5 primitive
cache misses of 2.7-7.1 ms, 23 ms of creation, against 0.9 ms of cache hits when the
same size ran again; over random prompt lengths the first run of a size cost 8 ms more
below 128 tokens, 16 ms at 128-255, 24 ms at 256-383 and 35 ms at 384-511 (an affine
function of T), and a size came back cold once about 100 other sizes had run (the
cache's 1,024 entries hold ~102 sizes, see CACHE_ENTRIES_PER_STEP_SIZE).

So a step's time is the fitted regression of its shape (andante.perf.cost_model) plus,
the first time its token count is seen, `new_size_fixed + new_size_per_token * T`
(`CostModel.new_size_time`, fitted by `andante calibrate` from cold and warm runs of the
same sizes). Which counts are warm is the executor's state, not the step's shape: a
`StepSizeCache` per simulated instance keeps the last `new_size_cache` counts, most
recent last, as the engine's primitive cache keeps their primitives. A long-running
server has most sizes warm; a fresh one (or one whose sizes churn through the LRU)
pays the setup again. Before, the calibration timed every prefill at a size run for the
first time and the model charged that to every prefill: on a quiet machine the warm
prefills of a served workload then took 0.82-0.86 of the prediction and the cold ones
1.13 (stop 20).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

#: Entries of oneDNN's primitive cache (its default, `ONEDNN_PRIMITIVE_CACHE_CAPACITY`),
#: and the entries one step size takes, measured (`ONEDNN_VERBOSE=2` cache misses, prompt
#: sizes run in turn): a size stayed cached while 90 other sizes ran and left it after
#: 95; at a capacity of 2,048, after 190 but not 210. Five primitives are built per size
#: (the QKV, output, gate, up and down projections); the cache counts ten entries.
ONEDNN_PRIMITIVE_CACHE = 1024
CACHE_ENTRIES_PER_STEP_SIZE = 10


def default_cache_sizes(primitive_cache: int = ONEDNN_PRIMITIVE_CACHE) -> int:
    """The step sizes whose primitives fit in a primitive cache of `primitive_cache`."""
    if primitive_cache <= 0:
        raise ValueError(f"primitive_cache must be positive, got {primitive_cache}")
    return max(1, primitive_cache // CACHE_ENTRIES_PER_STEP_SIZE)


class StepSizeCache:
    """The token counts an engine ran most recently, at most `capacity` (LRU)."""

    __slots__ = ("capacity", "_sizes")

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a non-negative integer, got {capacity!r}")
        self.capacity = capacity
        self._sizes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, num_tokens: object) -> bool:
        return num_tokens in self._sizes

    def is_new(self, num_tokens: int) -> bool:
        """Would a step of `num_tokens` tokens miss now? (Records nothing.)"""
        return bool(self.capacity) and num_tokens not in self._sizes

    def miss(self, num_tokens: int) -> bool:
        """Record a step of `num_tokens` tokens; True if that count was not cached (the
        step pays the setup). With capacity 0 nothing is cached and nothing is a miss."""
        if not self.capacity:
            return False
        sizes = self._sizes
        if num_tokens in sizes:
            sizes.move_to_end(num_tokens)
            return False
        sizes[num_tokens] = None
        if len(sizes) > self.capacity:
            sizes.popitem(last=False)
        return True

    def warm(self, sizes: Iterable[int]) -> None:
        """Record steps of `sizes`, in order (an engine's history before a run)."""
        for num_tokens in sizes:
            self.miss(num_tokens)
