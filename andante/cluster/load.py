"""Load reports: what an instance tells the controller after each of its steps.

The predicted drain time is the instance's own estimate, from its cost model, of how long
it would take to serve everything it holds if nothing else arrived: prefill every
uncomputed token, then decode the expected remaining output of every request, in batches
of at most `max_num_seqs`. Output lengths are unknown in advance, so each request is
expected to produce min(its max_tokens left, the mean output of the requests this
instance finished so far) more tokens (256 before any finished). It is a routing signal
(least-loaded, power-of-two), not a promise.
"""

from __future__ import annotations

from dataclasses import dataclass

from andante.engine.scheduler import Scheduler
from andante.perf.cost_model import CostModel

DEFAULT_EXPECTED_OUTPUT = 256.0
_PREFILL_PROBE_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One instance's figures after a step (clock seconds for `time` and `drain_time`).

    `num_received` counts the requests the instance has taken in (accepted or refused),
    so the controller knows how many it sent are still in transit.
    """

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    kv_usage: float = 0.0
    drain_time: float = 0.0
    num_received: int = 0
    max_num_seqs: int = 0
    time: float = 0.0
    num_free_blocks: int = 0
    num_blocks: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    num_dropped: int = 0
    num_prefilling: int = 0  # requests still waiting for their first token
    prediction_error: float | None = None

    @property
    def num_requests(self) -> int:
        return self.num_running + self.num_waiting + self.num_swapped


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


def build_report(scheduler: Scheduler, cost: CostModel | None, *, now: float,
                 num_received: int, num_steps: int, expected_output: float,
                 num_dropped: int = 0, prediction_error: float | None = None) -> LoadReport:
    """The report of an instance whose scheduler is `scheduler`, at time `now`."""
    kv = scheduler.kv
    drain = 0.0 if cost is None else predicted_drain_time(cost, scheduler, expected_output)
    return LoadReport(
        num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
        num_swapped=scheduler.num_swapped, kv_usage=kv.usage, drain_time=drain,
        num_received=num_received, max_num_seqs=scheduler.config.max_num_seqs, time=now,
        num_free_blocks=kv.num_free_device_blocks, num_blocks=kv.num_device_blocks,
        num_preemptions=scheduler.num_preemptions, num_steps=num_steps,
        num_dropped=num_dropped, num_prefilling=num_prefilling(scheduler),
        prediction_error=prediction_error,
    )
