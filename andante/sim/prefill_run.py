"""Prefill runs: the steps of a chunked prefill beside decodes, applied at once
(simulation fast path, the counterpart of andante.sim.decode_run).

Design note: with chunked prefill (vLLM v1's loop; Sarathi-Serve, Agrawal et al., OSDI
2024, §4 stall-free batching, whose 512-token budget splits most prompts) a long prompt
takes several steps, each holding one decode token of every other running request and a
chunk of the prompt as large as the budget left. A policy declares `prefill_run_budget`
> 0 (andante.engine.fast_path: the token budget of its next steps) when its step is
"every running request, each by its uncomputed tokens capped by the budget left" (the
decodes in any order, the prefill last), replaying in `on_prefill_run` any per-step
state it keeps (Andes' QoE and latency state). Then, after a step that advanced every
running request, the last by a chunk of its prompt and the others by a decode token, the
same batch certainly follows, only the chunk's position moving, while that request has
more than a chunk left: the chunk spends the budget, so no waiting or swapped request
can join, and the decodes stop only by a length limit (`num_tokens_before_length_stop`).
(vLLM's budget is fixed; Andes' grows with the running requests, one token each, so the
step that admitted the prompt had a chunk one token shorter.) The final chunk, shorter,
leaves budget over; it joins the run when nothing waits or is swapped (nobody could take
it), and samples the request's first token. The run ends before the next arrival, as a
decode run, and holds as many steps as find their blocks free (reserved when it begins).
Tests check that timelines are identical with and without.
"""

from __future__ import annotations

import math

from andante.core.request import Request, RequestStatus
from andante.engine.fast_path import SimFastPath
from andante.engine.scheduler import Scheduler
from andante.engine.stopping import num_tokens_before_length_stop
from andante.exec.batch import StepBatch
from andante.perf.shape import BatchShape

_RUNNING = RequestStatus.RUNNING


def prefill_run_chunks(scheduler: Scheduler, fast: SimFastPath, batch: StepBatch,
                       ) -> list[int]:
    """The prefill chunks of the last running request in the steps certain to follow
    `batch` (just applied) under the scheduler's policy `fast`, one per step; [] when no
    prefill run applies."""
    budget = fast.prefill_run_budget
    running = scheduler.running
    if budget <= 0 or not running or batch.swap_out or batch.swap_in:
        return []  # (a budget > 0: the policy vouches for its next steps)
    if len(batch.requests) != len(running) or scheduler.last_step_preempted \
            or scheduler.added_since_schedule:
        return []
    prefill = running[-1]
    if batch.requests[-1] is not prefill:  # (`on_prefill_run` is told of the batch's last)
        return []
    chunk = budget - len(running) + 1
    left = prefill.num_uncomputed_tokens
    if chunk < 1 or left <= 1 or prefill.status != _RUNNING:
        return []
    decodes = running[:-1]
    if any(r.status != _RUNNING or r.num_uncomputed_tokens != 1 for r in decodes):
        return []
    others_wait = bool(scheduler.waiting or scheduler.swapped)
    chunks = fast.prefill_run_chunks(running, others_wait)  # None: the budget's
    if chunks is None:
        num_full = (left - 1) // chunk  # steps that leave some of the prompt
        chunks = [chunk] * num_full
        final = left - num_full * chunk
        if final == chunk or not others_wait:
            chunks.append(final)
    if decodes:
        limit = num_tokens_before_length_stop(decodes, scheduler.max_num_tokens)
        del chunks[max(0, limit):]
    return chunks


def prefill_run_shapes(running: list[Request], chunks: list[int]) -> list[BatchShape]:
    """Each step's shape: the decodes of `running[:-1]`, one token longer per step, and
    the chunks of `running[-1]` (exact: every attention-pair count is an integer)."""
    *decodes, prefill = running
    base = BatchShape.decodes([req.num_computed_tokens for req in decodes])
    num_decodes = len(decodes)
    cached, total = prefill.num_computed_tokens, prefill.num_tokens
    shapes: list[BatchShape] = []
    for step, chunk in enumerate(chunks):
        shape = base.copy()
        shape.attn_pairs += step * num_decodes
        shape.kv_tokens_read += step * num_decodes
        shape.add(chunk, cached, cached + chunk == total)
        cached += chunk
        shapes.append(shape)
    return shapes


def _need(scheduler: Scheduler, running: list[Request], chunks: list[int], k: int) -> int:
    kv = scheduler.kv
    *decodes, prefill = running
    need = sum(kv.num_new_blocks_needed(r.request_id, r.num_computed_tokens + k)
               for r in decodes)
    return need + kv.num_new_blocks_needed(prefill.request_id,
                                           prefill.num_computed_tokens + sum(chunks[:k]))


def steps_within_limit(durations: list[float], limit: float) -> int:
    """How many of the first `durations` last at most `limit` seconds each (the policy's
    `run_step_limit`)."""
    if limit == math.inf:
        return len(durations)
    return next((k for k, d in enumerate(durations) if d > limit), len(durations))


def fit_prefill_blocks(scheduler: Scheduler, chunks: list[int], reserve: int = 0) -> int:
    """The largest k <= len(chunks) whose k steps find all their blocks free, leaving
    `reserve` (the policy's `decode_run_reserve_blocks`)."""
    running = scheduler.running
    free = scheduler.kv.num_free_device_blocks - reserve
    lo, hi = 0, len(chunks)
    if hi and _need(scheduler, running, chunks, hi) <= free:
        return hi  # (the common case: one count)
    while lo < hi:  # the blocks needed grow with k
        mid = (lo + hi + 1) // 2
        if _need(scheduler, running, chunks, mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def reserve_prefill_blocks(scheduler: Scheduler, running: list[Request],
                           chunks: list[int]) -> None:
    """Give the run's requests the blocks of its steps (when it begins)."""
    kv, k = scheduler.kv, len(chunks)
    *decodes, prefill = running
    for req in decodes:
        kv.append_slots(req.request_id, req.num_computed_tokens + k)
    kv.append_slots(prefill.request_id, prefill.num_computed_tokens + sum(chunks))


def record_prefill_run(scheduler: Scheduler, running: list[Request], chunks: list[int],
                       token_id: int, times: list[float]) -> list[Request]:
    """Apply the run's steps (ending at `times`) as stepping would: the decodes' tokens,
    then the prefill's progress and, after its final chunk, its first token."""
    *decodes, prefill = running
    got = scheduler.record_tokens(decodes, [len(times)] * len(decodes),
                                  [token_id] * len(decodes), *times) if decodes else []
    sampled = prefill.num_computed_tokens + sum(chunks) == prefill.num_tokens
    got += scheduler.record_tokens([prefill], [sum(chunks)], [token_id if sampled else None],
                                   times[-1])
    return got
