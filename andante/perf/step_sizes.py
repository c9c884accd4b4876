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

Step-size buckets take that setup out of serving. The real engine pads a step's rows for
its dense GEMMs up to a bucket (`StepBuckets.pad`): every count up to 64 (the first
range, granule 1) as it is (decode batches: few sizes, each step's padding would cost a
whole token's GEMM work per row), then multiples of a granule that grows with the count
(16 up to 512, 64 up to 2,048, 256 beyond), so that a few hundred distinct counts
collapse onto ~140 sizes up to 8,192 tokens, all built once at start-up (the executor's
warm-up) and kept in a primitive cache sized for them (`primitive_cache_entries`). The
granules weigh padding (~0.24 ms per row of SmolLM2 at two threads: 1.8 ms on average at
a granule of 16) against a cold size (8-25 ms below 384 tokens, more above). Measured
(benchmarks/step_buckets.py: 40 prompt lengths in 65-256 that are no bucket, each run
bucketed, exact and cold, exact and warm, interleaved in one process; busy machine, load
2.2-4.5, four runs): bucketed prefills took 7.4-9.5% less process CPU than the same
sizes cold and 1-6.4% more than them warm (the pad rows); a granule of 8 halved the pad
rows (4.3 vs 8.5 on average) but not that overhead (+4.9-5.8% over warm, 6.3-10.5% under
cold, two runs), so 16. A 256-token prefill, a bucket itself, ran at 0.992-1.004 of the
unbucketed path's CPU time. The warm-up takes 2-5 s up to 512 tokens (92 sizes) and 8-21
s up to 8,192 (140 sizes) on this busy 2-core machine, on one layer of SmolLM2. A
simulated instance mirrors it: it charges the step at the bucket's token count and warms
the buckets up to its step budget before the run (andante.exec.sim_executor).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from andante.perf.paths import env_switch
from andante.perf.shape import BatchShape
from andante.perf.specs import HardwareSpec

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


#: Set to anything but "" / "0": no step-size buckets (real engine and simulator alike).
NO_BUCKETS_ENV = "ANDANTE_NO_STEP_BUCKETS"

#: (upper bound, granule) of each range of step sizes, in order; counts up to the first
#: bound run as they are (granule 1).
DEFAULT_GRANULES: tuple[tuple[int, int], ...] = ((64, 1), (512, 16), (2048, 64))
#: The granule above the last bound.
DEFAULT_TOP_GRANULE = 256
#: oneDNN primitive cache entries kept per bucket (measured ~10 per size) and above them.
PRIMITIVE_ENTRIES_PER_BUCKET = 16
PRIMITIVE_CACHE_SLACK = 1024


@dataclass(frozen=True, slots=True)
class StepBuckets:
    """The token counts a bucketed engine runs its dense GEMMs at: `pad(n)` is the
    smallest bucket >= n (see the module note); `granules` are (upper bound, granule)
    ranges in increasing order, `top_granule` the granule above the last bound."""

    granules: tuple[tuple[int, int], ...] = DEFAULT_GRANULES
    top_granule: int = DEFAULT_TOP_GRANULE

    def __post_init__(self) -> None:
        previous = 0
        for bound, granule in self.granules:
            if granule < 1 or bound <= previous or bound % granule:
                raise ValueError(f"granules must be increasing bounds, each a multiple of "
                                 f"its positive granule, got {self.granules!r}")
            previous = bound
        if self.top_granule < 1:
            raise ValueError(f"top_granule must be >= 1, got {self.top_granule!r}")

    def pad(self, num_tokens: int) -> int:
        """The bucket of a step of `num_tokens` rows (0 for an empty step)."""
        if num_tokens <= 0:
            return 0
        granule = self.top_granule
        for bound, size in self.granules:
            if num_tokens <= bound:
                granule = size
                break
        return -(-num_tokens // granule) * granule

    def sizes(self, max_tokens: int) -> list[int]:
        """Every bucket a step of 1..`max_tokens` rows can be padded to, in order
        (the last one may exceed `max_tokens`)."""
        out: list[int] = []
        size = 0
        while size < max_tokens:
            size = self.pad(size + 1)
            out.append(size)
        return out


def primitive_cache_entries(num_buckets: int) -> int:
    """A oneDNN primitive cache capacity that keeps `num_buckets` warmed step sizes (and
    their LM-head sizes) with room to spare."""
    return PRIMITIVE_CACHE_SLACK + PRIMITIVE_ENTRIES_PER_BUCKET * max(0, num_buckets)


def engine_buckets(hardware: HardwareSpec) -> StepBuckets | None:
    """The buckets an andante CPU engine on `hardware` pads its steps to: the default
    ones where the profile has a new-size setup (a calibrated CPU engine), unless
    $ANDANTE_NO_STEP_BUCKETS is set; None otherwise (GPUs, built-in profiles)."""
    if not hardware.new_size_cache or env_switch(NO_BUCKETS_ENV):
        return None
    return StepBuckets()


def padded_shape(shape: BatchShape, buckets: StepBuckets) -> BatchShape:
    """`shape` as a bucketed engine runs it: its GEMM rows (tokens) and LM-head rows
    (sampled sequences) padded to their buckets; the attention terms stay the real
    rows'. A copy."""
    out = shape.copy()
    out.num_tokens = buckets.pad(shape.num_tokens)
    out.num_sampled = buckets.pad(shape.num_sampled)
    return out


def bucket_cache_sizes(num_buckets: int) -> int:
    """The step sizes a primitive cache raised for `num_buckets` buckets holds."""
    return default_cache_sizes(primitive_cache_entries(num_buckets))
