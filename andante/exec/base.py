"""The executor seam (DESIGN.md rule 2): one interface, a real and a modeled backend."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from andante.exec.batch import StepBatch, StepResult
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape


class Executor(Protocol):
    """Runs one engine step.

    Contract: `execute` first performs the batch's swap-outs then swap-ins (copying
    KV between the device and host tiers), then advances every request of the batch
    by its scheduled tokens, writing their KV into their block tables, and returns one
    sampled token per request whose `samples` flag is set (None for the others,
    aligned with the batch's requests). It never changes request
    state: the scheduler does that from the result. `cost_model` predicts step, swap
    and recompute costs for policies (calibrated for the real backend).
    `num_kv_blocks(block_size)` says how many device and host blocks the executor
    has room for.
    """

    cost_model: CostModel

    def execute(self, batch: StepBatch) -> StepResult: ...

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]: ...


class DecodeRunExecutor(Executor, Protocol):
    """An executor whose all-decode steps are predictable (andante.sim.decode_run): it
    samples `token_id` for every request, and `decode_run_durations` gives the durations
    of up to `max_steps` more all-decode steps of `batch`'s requests (`batch` just
    applied), stopping once their sum reaches `time_budget`; `prefill_run_durations`
    those of swap-free steps of the given shapes (andante.sim.prefill_run), likewise."""

    token_id: int

    def decode_run_durations(
        self, batch: StepBatch, max_steps: int, time_budget: float
    ) -> list[float]: ...

    def prefill_run_durations(
        self, shapes: list[BatchShape], time_budget: float
    ) -> list[float]: ...


@runtime_checkable
class Sleepable(Protocol):
    """An executor that can give its memory back while its server sleeps (vLLM's
    dev-mode sleep): `sleep(1)` releases its KV cache and holds its weights in host
    memory, `sleep(2)` drops the weights too; `wake_up()` restores what was released
    (reloading dropped weights). Asleep, it serves nothing: `execute` raises."""

    @property
    def sleeping(self) -> int | None: ...  # the level, None when awake

    def sleep(self, level: int) -> None: ...

    def wake_up(self) -> None: ...
