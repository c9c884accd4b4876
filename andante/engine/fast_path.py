"""`SimFastPath`: the optional second protocol of a policy, for the simulator's runs.

Design note (DESIGN.md §2.1, one scheduler, two clocks). The simulator runs the real
Scheduler and policy on a simulated clock, and by default it simulates every step: a
policy that implements only `Policy` (andante.engine.policy) is correct there, with
nothing else to learn. Stepping costs one decision per step, so a policy that can vouch
for its next decisions may also implement `SimFastPath`; the simulator checks for it
once per engine (`isinstance`; `FastPathDefaults` gives every member's "no run" answer)
and then applies runs of steps at once (andante.sim.decode_run, prefill_run,
after_finish), ending each before the next arrival, and lets the policy replay the
per-step state those steps would have recorded. The contract is "the same as
stepping": every token time and every policy state after a run is bit-identical to
what stepping gives (a test per policy compares both modes). The members:

- `stationary` (it may change after each `schedule`): until an arrival or a finish,
  the policy's next decisions depend only on the queues' contents and the free blocks,
  not on time, so a run of identical all-decode steps may be applied at once;
- `on_decode_run(batch, durations)`: such a run repeated `batch` with these step
  durations (called instead of `on_step_end` per step; the tokens are recorded);
- `decode_run_reserve_blocks`: device blocks that must still be free at the end of a
  run (a policy whose decision changes when free memory falls below a threshold);
- `prefill_run_budget` > 0 (the next steps' token budget): until an arrival or a
  finish the next steps are certainly "every running request, each by its uncomputed
  tokens capped by the budget left, the decodes first" (while the budget is spent,
  whatever waits; with nothing waiting after that), so runs of chunked-prefill steps
  may be applied at once; `prefill_run_chunks(running, others_wait)` gives the chunks
  where they are not "the budget left" (None: the budget's), `run_step_limit` the
  longest step such a run may hold (math.inf: any), and `on_prefill_run` replays it;
- `decode_budget` > 0: with nothing waiting or swapped and every running request
  decoding, the next step advances them all, in the order `decode_order(running,
  num_free_blocks)` gives (None if unsure), when they number at most that, so a run may
  start after a finish without a scheduled step first;
- `arrivals_commute_with_runs`: `on_arrival` neither reads nor writes what a run's
  replay does, so a run may hold the step that straddles an arrival (a policy without
  an `on_arrival` of its own commutes anyway);
- `run_max_steps`: at most this many steps of decode runs may follow the policy's last
  decision (math.inf: no cap; a policy whose decision stays the same only for a known
  number of steps, e.g. until its solver is due, counts them down in `on_decode_run`);
  `run_until`: the steps of those runs end before this simulated time (math.inf: any).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from andante.core.request import Request
from andante.exec.batch import StepBatch


@runtime_checkable
class SimFastPath(Protocol):
    """What lets the simulator apply runs of steps at once (see the module note)."""

    stationary: bool
    decode_run_reserve_blocks: int
    run_step_limit: float
    run_until: float

    @property
    def run_max_steps(self) -> float: ...
    arrivals_commute_with_runs: bool

    @property
    def prefill_run_budget(self) -> int: ...

    def prefill_run_chunks(self, running: Sequence[Request],
                           others_wait: bool) -> list[int] | None: ...

    @property
    def decode_budget(self) -> int: ...

    def decode_order(self, running: Sequence[Request],
                     num_free_blocks: int) -> Sequence[Request] | None: ...

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None: ...

    def on_prefill_run(self, batch: StepBatch, chunks: Sequence[int],
                       times: Sequence[float], durations: Sequence[float] = ()) -> None: ...


class FastPathDefaults:
    """Every `SimFastPath` member answering "no run": a policy that implements the
    protocol subclasses this (beside `BasePolicy`) and overrides what it vouches for."""

    stationary = False
    decode_run_reserve_blocks = 0
    run_step_limit = math.inf
    run_until = math.inf
    arrivals_commute_with_runs = False

    @property
    def run_max_steps(self) -> float:
        """math.inf: no cap on a decode run's steps."""
        return math.inf

    @property
    def prefill_run_budget(self) -> int:
        """0: no chunked-prefill runs."""
        return 0

    def prefill_run_chunks(self, running: Sequence[Request],
                           others_wait: bool) -> list[int] | None:
        """The chunks of `running[-1]`'s prompt in the steps certain to follow, each
        beside a decode token of every other running request ([]: none is certain;
        `others_wait`: requests wait or are swapped); None: each chunk is the
        `prefill_run_budget` left."""
        return None

    @property
    def decode_budget(self) -> int:
        """0: no decode run starts without a scheduled step first."""
        return 0

    def decode_order(self, running: Sequence[Request],
                     num_free_blocks: int) -> Sequence[Request] | None:
        """The running list's own order (`num_free_blocks`: free device blocks before
        the step)."""
        return running

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None:
        """The steps of a decode run repeating `batch` took `durations` (their tokens
        are recorded and their requests' `num_computed_tokens` advanced)."""
        return None

    def on_prefill_run(self, batch: StepBatch, chunks: Sequence[int],
                       times: Sequence[float], durations: Sequence[float] = ()) -> None:
        """The steps following `batch` prefilled `chunks` of its last request beside
        the others' decodes, lasted `durations` and ended at `times` (their tokens are
        recorded)."""
        return None
