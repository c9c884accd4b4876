"""What the decision-time benchmarks share: an executor that does no work, and a timer
of the scheduler's `schedule()` (policy decision plus applying it).

Used by scheduler_overhead.py, andes_overhead.py and fastserve_decision_time.py (run
as scripts from this folder)."""

from __future__ import annotations

import time

from andante.core import ManualClock
from andante.engine import Engine
from andante.exec.batch import StepBatch, StepResult
from andante.perf.cost_model import CostModel


class NoopExecutor:
    """Reports `num_device_blocks` / `num_host_blocks` and samples token 0 instantly,
    claiming `step_time` seconds per step."""

    def __init__(self, cost_model: CostModel, num_device_blocks: int,
                 num_host_blocks: int | None = None, step_time: float = 0.03) -> None:
        self.cost_model = cost_model
        self._blocks = (num_device_blocks,
                        num_device_blocks if num_host_blocks is None else num_host_blocks)
        self._step_time = step_time

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return self._blocks

    def execute(self, batch: StepBatch) -> StepResult:
        return StepResult([0 if s else None for s in batch.samples], self._step_time)


def time_decisions(engine: Engine, clock: ManualClock, repeats: int, start: float,
                   interval: float) -> list[float]:
    """Seconds of `repeats` scheduling decisions, the clock at `start` + k·`interval`;
    each step is completed (no work) so that state moves on."""
    samples = []
    for step in range(repeats):
        clock.advance_to(start + step * interval)
        started = time.perf_counter()
        batch = engine.scheduler.schedule()
        samples.append(time.perf_counter() - started)
        engine.scheduler.update(batch, engine.executor.execute(batch))
    return samples
