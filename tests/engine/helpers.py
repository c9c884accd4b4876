"""A fake executor and request factory for scheduler tests (no cost model needed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from andante.core import ManualClock, Request, SamplingParams, SyntheticTokens
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.exec.batch import StepBatch, StepResult
from andante.llm import build_engine
from andante.policies import SchedulerConfig, StepPlan


class FakeExecutor:
    """Every step takes `step_time`; samples token `1000 + position` (never EOS)."""

    cost_model: Any = None

    def __init__(self, num_device_blocks: int, num_host_blocks: int = 0, step_time: float = 0.01):
        self.blocks = (num_device_blocks, num_host_blocks)
        self.step_time = step_time
        self.batches: list[StepBatch] = []

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return self.blocks

    def execute(self, batch: StepBatch) -> StepResult:
        self.batches.append(batch)
        sampled: list[int | None] = [
            1000 + cached + n if s else None
            for cached, n, s in zip(
                batch.num_cached_tokens, batch.num_new_tokens, batch.samples, strict=True
            )
        ]
        return StepResult(sampled_token_ids=sampled, duration=self.step_time)


class ScriptedPolicy:
    """A stand-in policy that records one scripted decision per step."""

    name = "scripted"

    def __init__(self, decide: Callable[[StepPlan], None]) -> None:
        self.decide = decide

    def schedule(self, plan: StepPlan) -> None:
        self.decide(plan)

    def on_arrival(self, req: Request) -> None: ...

    def on_finish(self, req: Request) -> None: ...

    def on_step_end(self, batch: Any, result: Any) -> None: ...


def make_request(
    rid: str,
    prompt_len: int,
    max_tokens: int,
    arrival: float = 0.0,
    priority: int = 0,
    slo: SLO | None = None,
) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=SyntheticTokens(prompt_len),
        sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        arrival_time=arrival,
        priority=priority,
        slo=slo or SLO(),
    )


def make_engine(
    policy: str,
    num_device_blocks: int,
    num_host_blocks: int = 0,
    block_size: int = 4,
    options: dict[str, Any] | None = None,
    **config: Any,
) -> tuple[Engine, FakeExecutor, ManualClock]:
    clock = ManualClock()
    executor = FakeExecutor(num_device_blocks, num_host_blocks)
    cfg = SchedulerConfig(**{"block_size": block_size, "watermark": 0.0, **config})
    engine = build_engine(executor, clock, policy, cfg, options)
    return engine, executor, clock


def run_to_completion(engine: Engine, clock: ManualClock, max_steps: int = 10_000) -> int:
    """Step until no work is left; checks KV invariants each step. Returns step count."""
    steps = 0
    while engine.has_work:
        batch, result = engine.begin_step()
        assert not batch.is_empty, "policy stalled with work pending"
        clock.advance_to(clock.now() + result.duration)
        engine.finish_step(batch, result)
        engine.scheduler.kv.check_invariants()
        steps += 1
        assert steps < max_steps, "did not finish"
    return steps
