"""Decode runs: applying k identical all-decode steps at once (simulation fast path).

Design note: between two events that change a vLLM-style decision (an arrival, a
finish, a block shortage), a stationary policy schedules the same all-decode batch
step after step. The simulator asks `decode_run_limit` how many more such steps are
certain (nobody reaches a stop condition before the last of them, the blocks they
need are free, the policy declares itself stationary), models their durations, and
`apply_decode_run` records their tokens with the exact times step-by-step simulation
would give; when the run ends, `Scheduler.check_stops` finishes whoever stopped on its
last step. A test checks the two modes produce identical timelines.
"""

from __future__ import annotations

from itertools import repeat

from andante.engine.scheduler import Scheduler
from andante.exec.batch import StepBatch


def _is_all_decode(scheduler: Scheduler, batch: StepBatch) -> bool:
    if not batch.requests or batch.swap_out or batch.swap_in:
        return False
    if len(batch.requests) != len(scheduler.running) or scheduler.last_step_preempted:
        return False
    if scheduler.added_since_schedule:  # the next decision sees a new request
        return False
    return all(n == 1 for n in batch.num_new_tokens) and all(batch.samples)


def _fits(scheduler: Scheduler, batch: StepBatch, k: int) -> bool:
    kv = scheduler.kv
    need = 0
    for req in batch.requests:
        need += kv.num_new_blocks_needed(req.request_id, req.num_computed_tokens + k)
    return need <= kv.num_free_device_blocks


def decode_run_limit(scheduler: Scheduler, batch: StepBatch, token_id: int) -> int:
    """How many more all-decode steps like `batch` (just applied) are certain to follow,
    as far as stop conditions go: the last of them may finish requests, no earlier one
    does (see `fit_blocks` for the KV blocks they need)."""
    if not getattr(scheduler.policy, "stationary", False) or scheduler.stop_checker is not None:
        return 0
    if not _is_all_decode(scheduler, batch):
        return 0
    max_len = scheduler.config.max_model_len
    cache_tokens = scheduler.kv.num_device_blocks * scheduler.kv.block_size
    limit = cache_tokens
    for req in batch.requests:
        if req.is_finished:
            return 0
        sampling = req.sampling
        if token_id in sampling.stop_token_ids or (
            not sampling.ignore_eos and token_id == sampling.eos_token_id
        ):
            return 0
        n = req.num_tokens  # the j-th step stops it once n + j or its output reaches a limit
        limit = min(limit, sampling.max_tokens - len(req.output_token_ids),
                    max_len - n, cache_tokens - n)
    return max(0, limit)


def fit_blocks(scheduler: Scheduler, batch: StepBatch, num_steps: int) -> int:
    """The largest k <= num_steps whose k decode steps find all their blocks free."""
    if num_steps <= 0 or _fits(scheduler, batch, num_steps):
        return max(0, num_steps)
    lo, hi = 0, num_steps - 1  # need(k) grows with k: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(scheduler, batch, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def apply_decode_run(
    scheduler: Scheduler, batch: StepBatch, token_times: list[float], token_id: int
) -> None:
    """Record len(token_times) more decode steps of `batch`'s requests."""
    k = len(token_times)
    if k == 0:
        return
    kv = scheduler.kv
    for req in batch.requests:
        req.num_computed_tokens += k
        kv.append_slots(req.request_id, req.num_computed_tokens)
        req.output_token_ids.extend(repeat(token_id, k))
        req.timeline.token_times.extend(token_times)
