"""Engines with Ascendra policies over a simulated A100 (for the policy tests)."""

from __future__ import annotations

from typing import Any

from andante.core import ManualClock, Request, SamplingParams, SyntheticTokens
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.exec.sim_executor import SimExecutor
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import SchedulerConfig


def cost_model() -> CostModel:
    return CostModel(get_model("mistral-7b"), get_hardware("a100-80g"))


def engine(policy: str, options: dict[str, Any] | None = None,
           **config: Any) -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    cfg = SchedulerConfig(**{"max_num_seqs": 128, **config})
    return build_engine(SimExecutor(cost_model()), clock, policy, cfg, options), clock


def request(rid: str, prompt: int, arrival: float = 0.0, ttft: float | None = 1.0,
            max_tokens: int = 16, tbt: float | None = 0.15) -> Request:
    return Request(rid, SyntheticTokens(prompt), SamplingParams(max_tokens=max_tokens,
                                                                ignore_eos=True),
                   arrival, slo=SLO(ttft=ttft, tbt=tbt))


def step(eng: Engine, clock: ManualClock) -> None:
    batch, result = eng.begin_step()
    clock.advance_to(clock.now() + result.duration)
    eng.finish_step(batch, result)
