"""Offline generation through the real scheduler: the `andante generate` engine.

`generate(prompts, ...)` tokenizes (optionally through the chat template), submits
every prompt to an engine built with `build_engine` over a `TorchExecutor` and steps it
until all requests finish. `run_timed` replays requests at their arrival times on the
wall clock (for fidelity benchmarks against the simulator).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from andante.core.clock import MonotonicClock
from andante.core.request import Request
from andante.core.sampling import SamplingParams
from andante.engine.engine import Engine
from andante.engine.factory import build_engine
from andante.models.loader import LoadedModel, load_model
from andante.models.stopping import StopStrings, truncate_at_stop
from andante.models.tokenizer import TextTokenizer
from andante.policies.config import SchedulerConfig

Prompt = str | Sequence[int]


@dataclass(slots=True)
class Completion:
    request: Request
    text: str
    token_ids: list[int]
    finish_reason: str | None


def with_eos(sampling: SamplingParams, tokenizer: TextTokenizer) -> SamplingParams:
    """`sampling` with the model's end tokens: the first as eos_token_id, the others as
    stop token ids (unless ignore_eos or already set)."""
    if sampling.eos_token_id is not None or sampling.ignore_eos:
        return sampling
    first, *others = tokenizer.eos_token_ids
    extra = tuple(t for t in others if t not in sampling.stop_token_ids)
    return dataclasses.replace(sampling, eos_token_id=first,
                               stop_token_ids=sampling.stop_token_ids + extra)


def encode_prompt(tokenizer: TextTokenizer, prompt: Prompt, chat: bool,
                  system: str | None = None) -> list[int]:
    if not isinstance(prompt, str):
        return list(prompt)
    if not chat:
        return tokenizer.encode(prompt)
    messages = [{"role": "system", "content": system}] if system else []
    return tokenizer.apply_chat_template([*messages, {"role": "user", "content": prompt}])


def build_offline_engine(model: LoadedModel, policy: str = "vllm",
                         config: SchedulerConfig | None = None,
                         executor: Any = None, policy_options: dict[str, Any] | None = None,
                         clock: MonotonicClock | None = None) -> Engine:
    """An engine over `executor` (default: a new TorchExecutor) with stop strings."""
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions

    if executor is None:
        executor = TorchExecutor(model, TorchExecutorOptions())
    if config is None:
        config = SchedulerConfig(max_model_len=executor.max_model_len,
                                 max_num_batched_tokens=max(8192, executor.max_model_len))
    return build_engine(executor, clock or MonotonicClock(), policy, config,
                        policy_options, StopStrings(model.tokenizer))


def run_to_completion(engine: Engine, on_step: Callable[[Any], None] | None = None) -> None:
    while engine.has_work:
        output = engine.step()
        if on_step is not None:
            on_step(output)


def generate(prompts: Sequence[Prompt], sampling: SamplingParams | None = None, *,
             model: LoadedModel | str | None = None, chat: bool = False,
             system: str | None = None, engine: Engine | None = None,
             policy: str = "vllm") -> list[Completion]:
    """Complete every prompt (text, or token ids used as they are); results in order.

    Pass `engine` (from `build_offline_engine`) to reuse one executor across calls.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    tokenizer = loaded.tokenizer
    params = with_eos(sampling or SamplingParams(max_tokens=64, temperature=0.0), tokenizer)
    engine = engine or build_offline_engine(loaded, policy)
    now = engine.clock.now()
    requests = [Request(f"gen-{i}-{time.monotonic_ns()}", encode_prompt(tokenizer, p, chat, system),
                        params, now) for i, p in enumerate(prompts)]
    for req in requests:
        engine.add_request(req)
    run_to_completion(engine)
    return [Completion(req, truncate_at_stop(tokenizer.decode(req.output_token_ids),
                                             params.stop),
                       list(req.output_token_ids), req.finish_reason) for req in requests]


def run_timed(engine: Engine, requests: Sequence[Request], idle_sleep: float = 0.0005) -> None:
    """Submit each request when the engine's clock reaches its arrival time (sorted by
    arrival) and step until all finished: a live replay of a workload."""
    clock = engine.clock
    pending = sorted(requests, key=lambda r: r.arrival_time)
    index = 0
    while index < len(pending) or engine.has_work:
        now = clock.now()
        while index < len(pending) and pending[index].arrival_time <= now:
            engine.submit(pending[index])
            index += 1
        if engine.has_work:
            engine.step()
        elif index < len(pending):
            time.sleep(min(idle_sleep, max(0.0, pending[index].arrival_time - now)))
