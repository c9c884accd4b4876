"""Decode runs: applying k identical all-decode steps at once (simulation fast path).

Design note: between two events that change a vLLM-style decision (an arrival, a
finish, a block shortage), a stationary policy (`SimFastPath.stationary`,
andante.engine.fast_path) schedules the same
all-decode batch step after step, and a `DecodeRunExecutor` samples the same token for
every request of it. `decode_run_limit` says how many more such steps are certain: the
stop rules passed the token each request just got, so only a length limit can stop one
(`num_tokens_before_length_stop`, the count form of `check_stop`'s), on the last step of
the run at the earliest; `fit_blocks`, how many find their blocks free. Their tokens go through
`Scheduler.record_tokens`, as a step's do, when the run ends, with the exact times
step-by-step simulation would give (the stop rules then finish whoever stopped on its
last step), and the engine's observers get one output standing for the run's steps
(`StepOutput.num_steps`). A test checks that both modes produce identical timelines.
"""

from __future__ import annotations

from bisect import bisect_left

from andante.engine.fast_path import SimFastPath
from andante.engine.scheduler import Scheduler
from andante.engine.stopping import num_tokens_before_length_stop
from andante.exec.batch import StepBatch


def _is_all_decode(scheduler: Scheduler, batch: StepBatch) -> bool:
    if not batch.requests or batch.swap_out or batch.swap_in:
        return False
    # a request that finished (or was aborted) since has left `running`
    if len(batch.requests) != len(scheduler.running) or scheduler.last_step_preempted:
        return False
    if scheduler.added_since_schedule:  # the next decision sees a new request
        return False
    return batch.num_tokens == len(batch.requests) and all(batch.samples)


def decode_run_limit(scheduler: Scheduler, fast: SimFastPath, batch: StepBatch) -> int:
    """How many more all-decode steps like `batch` (just applied) are certain to follow,
    as far as stop rules go, for the scheduler's policy `fast`: the last of them may
    finish requests, no earlier one does (see `fit_blocks` for the KV blocks they
    need)."""
    if not fast.stationary or not _is_all_decode(scheduler, batch):
        return 0
    return max(0, num_tokens_before_length_stop(batch.requests, scheduler.max_num_tokens))


def _fits(scheduler: Scheduler, batch: StepBatch, k: int, reserve: int) -> bool:
    kv = scheduler.kv
    need = sum(kv.num_new_blocks_needed(r.request_id, r.num_computed_tokens + k)
               for r in batch.requests)
    return need <= kv.num_free_device_blocks - reserve


def fit_blocks(scheduler: Scheduler, batch: StepBatch, num_steps: int,
               reserve: int = 0) -> int:
    """The largest k <= num_steps whose k decode steps find all their blocks free,
    leaving `reserve` (the policy's `decode_run_reserve_blocks`)."""
    if num_steps <= 0 or _fits(scheduler, batch, num_steps, reserve):
        return max(0, num_steps)
    # the blocks needed grow with k: bisect for the first k that does not fit
    first_short = bisect_left(range(num_steps), True,
                              key=lambda k: not _fits(scheduler, batch, k, reserve))
    return max(0, first_short - 1)  # 0: even the reserve is not free now


def reserve_blocks(scheduler: Scheduler, batch: StepBatch, num_steps: int) -> None:
    """Give `batch`'s requests the blocks of `num_steps` more decode steps (when the run
    begins; `fit_blocks` checked that they are free)."""
    kv = scheduler.kv
    for req in batch.requests:
        kv.append_slots(req.request_id, req.num_computed_tokens + num_steps)
