"""The calibration times prefill-only steps after an idle wait, as serving meets them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from andante.exec.batch import StepBatch, StepResult
from andante.exec.torch_calibrate import LeadIn, SweepConfig, measure_steps


class _RecordingExecutor:
    """Just enough of a TorchExecutor: logs each step's chunks and the pauses between."""

    def __init__(self, events: list[object]) -> None:
        self.options = SimpleNamespace(block_size=16)
        self.model = SimpleNamespace(config=SimpleNamespace(vocab_size=50_000))
        self.max_model_len = 4096
        self.events = events

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return 1024, 0

    def execute(self, batch: StepBatch) -> StepResult:
        chunks = tuple(zip(batch.num_new_tokens, batch.num_cached_tokens, strict=True))
        self.events.append(chunks)
        return StepResult([1] * len(chunks), 0.01 + 1e-4 * batch.num_tokens)


def _run(shapes: list[tuple[tuple[int, int], ...]], idle: float) -> list[object]:
    events: list[object] = []
    executor = _RecordingExecutor(events)
    lead_in = LeadIn(idle, pause=lambda seconds: events.append(("idle", seconds)))
    measure_steps(executor, shapes, repeats=2, lead_in=lead_in)  # type: ignore[arg-type]
    return events


def test_prefill_only_steps_run_after_an_idle_wait() -> None:
    events = _run([((64, 0),)], idle=0.1)
    lead, idle = ((1, 32),), ("idle", 0.1)
    # a warm-up, then per repeat: lead-in decode, idle, cold run, lead-in, idle, warm run
    assert events[1:] == [lead, idle, ((65, 0),), lead, idle, ((65, 0),),
                          lead, idle, ((70, 0),), lead, idle, ((70, 0),)]


def test_mixed_and_decode_steps_follow_a_decode_step_without_idling() -> None:
    events = _run([((64, 0), (1, 128)), ((1, 64),) * 4], idle=0.1)
    assert ("idle", 0.1) not in events
    assert events.count(((1, 32),)) == 4  # a lead-in before each of the 2x2 mixed runs


def test_no_idle_wait_when_set_to_zero() -> None:
    assert all(not isinstance(e, tuple) or e[0] != "idle"
               for e in _run([((64, 0),)], idle=0.0))


def test_idle_before_prefill_must_not_be_negative() -> None:
    assert SweepConfig().idle_before_prefill > 0
    with pytest.raises(ValueError, match="idle_before_prefill"):
        SweepConfig(idle_before_prefill=-1.0)
