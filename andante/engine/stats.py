"""SchedulerStats: the engine's figures after one step; EngineLimits: what it could
ever serve; the step observer seam.

Design note (vLLM v1's `SchedulerStats`): one immutable value per step carries every
figure that the server's /metrics and live page, the cluster's load reports and the
experiments read, so none of them walks the scheduler's internals. Taking it is O(1).
Observers (`Engine.add_observer`) see each step's output with these stats: experiments
and benchmarks watch the engine through them instead of replacing its methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from andante.engine.engine import StepOutput


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Figures after a step (engine-clock seconds for `time`)."""

    time: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_free_blocks: int = 0
    num_blocks: int = 0
    num_free_host_blocks: int = 0
    num_host_blocks: int = 0
    num_preemptions: int = 0  # since the engine started
    num_steps: int = 0
    max_num_seqs: int = 0
    # sums over the unfinished requests (the scheduler keeps them: `WorkTotals`)
    num_prefilling: int = 0  # requests still waiting for their first token
    num_tokens: int = 0  # context: prompt + output tokens
    num_uncomputed_tokens: int = 0  # known tokens not in a KV cache yet
    num_output_tokens: int = 0  # generated so far
    num_remaining_output_tokens: int = 0  # max_tokens left
    # prefix caching, since the engine started (vLLM's counters, in tokens)
    prefix_cache_queries: int = 0  # tokens looked up at admissions
    prefix_cache_hits: int = 0  # of them, found cached (prefill saved)
    num_cached_free_blocks: int = 0  # of num_free_blocks, keeping a cached prefix
    # KV blocks the queued work needs: uncomputed tokens beyond running decodes' next
    # token (KunServe §4.1's demand of the queued requests)
    num_queued_kv_blocks: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens / queried tokens (0 before any query)."""
        queries = self.prefix_cache_queries
        return self.prefix_cache_hits / queries if queries else 0.0

    @property
    def num_requests(self) -> int:
        return self.num_running + self.num_waiting + self.num_swapped

    @property
    def kv_usage(self) -> float:
        """Fraction of device blocks in use (vLLM's kv_cache_usage_perc / 100)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The largest request an engine could ever serve: the server's edge refuses any
    other request against these figures, without asking an engine."""

    max_model_len: int
    kv_capacity_tokens: int  # the whole device KV cache, in tokens


class StepObserver(Protocol):
    """Called by the engine after every step it applies (decode runs included), on the
    thread that steps the engine. It must not mutate the engine or its requests."""

    def __call__(self, output: StepOutput, stats: SchedulerStats) -> None: ...
