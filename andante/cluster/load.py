"""Load reports: what an instance tells the controller after each of its steps.

A report is the engine's own `SchedulerStats` of that step (among them the requests
still waiting for their first token: Ascendra's HP tickets) plus what only the cluster
side knows: how many requests the instance took in (the controller derives what is
still in transit) and the predicted drain time.

The predicted drain time is the instance's own estimate, from its cost model, of how long
it would take to serve everything it holds if nothing else arrived: prefill every
uncomputed token, then decode the expected remaining output of every request, in batches
of at most `max_num_seqs`. Output lengths are unknown in advance: with m the mean output
of the requests this instance finished so far (256 before any finished), each request is
expected to produce about max(1, m - its output so far) more tokens, at most its
max_tokens left. It is a routing signal (least-loaded, power-of-two), not a promise,
computed in O(1) from the stats' sums over the requests, so it approximates the
per-request form: for N requests with O output tokens and R max_tokens left in all,
the decode tokens are min(R, max(N, N·m - O)) and the longest request is taken to need
max(1, m) of them (one that has just started), capped by that total. The two agree while
every request expects between 1 and its max_tokens left and one has no output yet;
otherwise the closed form counts fewer decode tokens where requests past the mean (each
still expecting 1) offset those short of it, more where a request's max_tokens caps it
below the mean, and a longer longest request when all have made progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from andante.engine.stats import SchedulerStats
from andante.perf.cost_model import CostModel

DEFAULT_EXPECTED_OUTPUT = 256.0
_PREFILL_PROBE_TOKENS = 1024
_SUMMED_FIELDS = tuple(f.name for f in fields(SchedulerStats)
                       if f.name not in ("time", "max_num_seqs"))


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One instance's figures after a step (clock seconds for `drain_time`)."""

    stats: SchedulerStats = field(default_factory=SchedulerStats)
    num_received: int = 0  # requests taken in (accepted or refused)
    drain_time: float = 0.0
    num_dropped: int = 0
    prediction_error: float | None = None

    @property
    def num_prefilling(self) -> int:
        """Requests still waiting for their first token."""
        return self.stats.num_prefilling


def total_stats(stats: Sequence[SchedulerStats], num_queued: int = 0) -> SchedulerStats:
    """A cluster's figures as one engine's: the sums (`num_queued` requests in the
    controller's queue count as waiting), the latest time, the widest batch."""
    values: dict[str, float] = {
        name: sum(getattr(s, name) for s in stats) for name in _SUMMED_FIELDS
    }
    values["num_waiting"] += num_queued
    return SchedulerStats(
        time=max((s.time for s in stats), default=0.0),
        max_num_seqs=max((s.max_num_seqs for s in stats), default=0),
        **values,  # type: ignore[arg-type]
    )


def predicted_drain_time(cost: CostModel, stats: SchedulerStats,
                         expected_output: float) -> float:
    """Seconds to finish the work in `stats` (see the module note)."""
    num_requests = stats.num_requests
    if not num_requests:
        return 0.0
    # every unfinished request has at least its next token uncomputed
    prefill_tokens = max(0, stats.num_uncomputed_tokens - num_requests)
    decode_tokens = min(float(stats.num_remaining_output_tokens),
                        max(float(num_requests),
                            num_requests * expected_output - stats.num_output_tokens))
    longest = min(decode_tokens, max(1.0, expected_output))
    per_token = cost.prefill_time(_PREFILL_PROBE_TOKENS) / _PREFILL_PROBE_TOKENS
    batch = max(1, min(num_requests, stats.max_num_seqs))
    steps = max(longest, decode_tokens / batch)
    step = cost.decode_time(batch, stats.num_tokens // num_requests)
    return prefill_tokens * per_token + steps * step
