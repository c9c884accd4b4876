"""Andes' `pause_buffered_s`: in a step that admits queued requests (all of which fit),
running streams with more than that many seconds of text buffered sit the step out."""

from __future__ import annotations

from typing import Any

import pytest

from andante.core import ManualClock
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.llm import build_engine
from andante.policies import SchedulerConfig
from andante.policies.andes import AndesOptions
from tests.engine.helpers import FakeExecutor, make_request

STEP_S = 0.02


def _engine(options: dict[str, Any], max_num_seqs: int = 16) -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    config = SchedulerConfig(block_size=4, max_model_len=256, max_num_batched_tokens=256,
                             max_num_seqs=max_num_seqs)
    return build_engine(FakeExecutor(512, 0), clock, "andes", config, options), clock


def _step(engine: Engine, clock: ManualClock) -> list[str]:
    batch, result = engine.begin_step()
    clock.advance_to(clock.now() + STEP_S)
    engine.finish_step(batch, result)
    return [r.request_id for r in batch.requests]


def _buffered_stream_then_arrival(options: dict[str, Any],
                                  max_num_seqs: int = 16) -> tuple[list[str], list[str]]:
    """A slow reader (1 token/s) and a fast one (50 tokens/s) stream for 10 steps, so
    the slow one has ~8 s of text buffered and the fast one none; then a request
    arrives. Returns the ids in the arrival's step and in the next step."""
    engine, clock = _engine(options, max_num_seqs)
    engine.add_request(make_request("slow", 16, 100, slo=SLO(ttft=1.0, tds=1.0)))
    engine.add_request(make_request("fast", 16, 100, slo=SLO(ttft=1.0, tds=50.0)))
    for _ in range(10):
        _step(engine, clock)
    engine.add_request(make_request("new", 24, 10, slo=SLO(ttft=1.0, tds=5.0)))
    return _step(engine, clock), _step(engine, clock)


def test_a_buffered_stream_sits_out_the_admitting_step() -> None:
    admitting, after = _buffered_stream_then_arrival({})
    assert "new" in admitting and "fast" in admitting
    assert "slow" not in admitting  # ~8 s of text buffered: its reader does not notice
    assert set(after) == {"slow", "fast", "new"}  # back to every stream


def test_off_every_stream_decodes_in_the_admitting_step() -> None:
    admitting, _ = _buffered_stream_then_arrival({"pause_buffered_s": 0.0})
    assert set(admitting) == {"slow", "fast", "new"}


def test_no_pause_when_the_queue_waits_for_sequence_slots() -> None:
    admitting, _ = _buffered_stream_then_arrival({}, max_num_seqs=4)  # 3 > half of 4
    assert set(admitting) == {"slow", "fast", "new"}


def test_the_option_is_checked() -> None:
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="pause_buffered_s"):
            AndesOptions(pause_buffered_s=bad)
