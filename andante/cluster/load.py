"""Load reports: what an instance tells the controller after each of its steps.

A report is the engine's own `SchedulerStats` of that step plus what only the cluster
side knows: how many requests the instance took in (the controller derives what is
still in transit), the requests still waiting for their first token (Ascendra's HP
tickets) and the predicted drain time.

The predicted drain time is the instance's own estimate, from its cost model, of how long
it would take to serve everything it holds if nothing else arrived: prefill every
uncomputed token, then decode the expected remaining output of every request, in batches
of at most `max_num_seqs`. Output lengths are unknown in advance, so each request is
expected to produce min(its max_tokens left, the mean output of the requests this
instance finished so far) more tokens (256 before any finished). It is a routing signal
(least-loaded, power-of-two), not a promise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from andante.engine.scheduler import Scheduler
from andante.engine.stats import SchedulerStats
from andante.perf.cost_model import CostModel

DEFAULT_EXPECTED_OUTPUT = 256.0
_PREFILL_PROBE_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One instance's figures after a step (clock seconds for `drain_time`)."""

    stats: SchedulerStats = field(default_factory=SchedulerStats)
    num_received: int = 0  # requests taken in (accepted or refused)
    drain_time: float = 0.0
    num_prefilling: int = 0  # requests still waiting for their first token
    num_dropped: int = 0
    prediction_error: float | None = None


def total_stats(stats: Sequence[SchedulerStats], num_queued: int = 0) -> SchedulerStats:
    """A cluster's figures as one engine's: the sums (`num_queued` requests in the
    controller's queue count as waiting), the latest time, the widest batch."""
    return SchedulerStats(
        time=max((s.time for s in stats), default=0.0),
        num_running=sum(s.num_running for s in stats),
        num_waiting=sum(s.num_waiting for s in stats) + num_queued,
        num_swapped=sum(s.num_swapped for s in stats),
        num_free_blocks=sum(s.num_free_blocks for s in stats),
        num_blocks=sum(s.num_blocks for s in stats),
        num_free_host_blocks=sum(s.num_free_host_blocks for s in stats),
        num_host_blocks=sum(s.num_host_blocks for s in stats),
        num_preemptions=sum(s.num_preemptions for s in stats),
        num_steps=sum(s.num_steps for s in stats),
        max_num_seqs=max((s.max_num_seqs for s in stats), default=0),
    )


class OutputLengthMeter:
    """Running mean of finished requests' output lengths (the expected output)."""

    __slots__ = ("_count", "_total")

    def __init__(self) -> None:
        self._count = 0
        self._total = 0

    def observe(self, num_output_tokens: int) -> None:
        self._count += 1
        self._total += num_output_tokens

    @property
    def mean(self) -> float:
        return self._total / self._count if self._count else DEFAULT_EXPECTED_OUTPUT


def predicted_drain_time(cost: CostModel, scheduler: Scheduler, expected_output: float) -> float:
    """Seconds to finish the scheduler's current work (see the module note)."""
    requests = scheduler.requests
    if not requests:
        return 0.0
    prefill_tokens = 0
    decode_tokens = 0.0
    longest = 0.0
    context = 0
    for req in requests.values():
        prefill_tokens += max(0, req.num_uncomputed_tokens - 1)
        left = min(float(req.num_remaining_output_tokens),
                   max(1.0, expected_output - req.num_output_tokens))
        decode_tokens += left
        longest = max(longest, left)
        context += req.num_tokens
    per_token = cost.prefill_time(_PREFILL_PROBE_TOKENS) / _PREFILL_PROBE_TOKENS
    batch = max(1, min(len(requests), scheduler.config.max_num_seqs))
    steps = max(longest, decode_tokens / batch)
    step = cost.decode_time(batch, context // len(requests))
    return prefill_tokens * per_token + steps * step


def num_prefilling(scheduler: Scheduler) -> int:
    """Requests that have not produced their first token (waiting or prefilling)."""
    running = sum(1 for req in scheduler.running if not req.output_token_ids)
    return running + sum(1 for req in scheduler.waiting if not req.output_token_ids)
