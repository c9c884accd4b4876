"""Assembly: build an engine from parts and configuration, and generate offline.

As nano-vllm's `llm.py`, this module sits above the engine and the policies and wires
them: `build_engine` sizes the block manager from the executor and picks the policy by
name (the engine never imports a policy); `generate` and `build_offline_engine` complete
prompts through the real scheduler (the `andante generate` engine); `run_timed` replays
requests at their arrival times on the wall clock (fidelity benchmarks). The model
loader (and torch with it) is imported only by the functions that load a model, so the
simulator, which builds engines here, runs with numpy alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from andante.core.clock import Clock, MonotonicClock
from andante.core.request import Request
from andante.core.sampling import SamplingParams
from andante.engine.config import SchedulerConfig
from andante.engine.engine import Engine, StepOutput
from andante.engine.policy import PolicyContext
from andante.engine.scheduler import Scheduler
from andante.exec.base import Executor
from andante.kv.block_manager import KVBlockManager
from andante.policies.registry import make_policy

if TYPE_CHECKING:
    from andante.models.loader import LoadedModel
    from andante.models.tokenizer import TextTokenizer

Prompt = str | Sequence[int]


def build_engine(
    executor: Executor,
    clock: Clock,
    policy: str = "vllm",
    config: SchedulerConfig | None = None,
    policy_options: dict[str, Any] | None = None,
) -> Engine:
    config = config or SchedulerConfig()
    num_device, num_host = executor.num_kv_blocks(config.block_size)
    if num_device < 1:
        raise ValueError("the executor has no room for a single KV block")
    kv = KVBlockManager(config.block_size, num_device, num_host, config.watermark,
                        config.enable_prefix_caching)
    ctx = PolicyContext(clock, config, executor.cost_model, dict(policy_options or {}))
    scheduler = Scheduler(config, kv, make_policy(policy, ctx), clock)
    return Engine(scheduler, executor, clock)

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
                         clock: MonotonicClock | None = None,
                         enable_prefix_caching: bool = True) -> Engine:
    """An engine over `executor` (default: a new TorchExecutor); `config` None: the
    executor's context, prefix caching as `enable_prefix_caching`."""
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions

    if executor is None:
        executor = TorchExecutor(model, TorchExecutorOptions())
    if config is None:
        config = SchedulerConfig(max_model_len=executor.max_model_len,
                                 max_num_batched_tokens=max(8192, executor.max_model_len),
                                 enable_prefix_caching=enable_prefix_caching)
    return build_engine(executor, clock or MonotonicClock(), policy, config, policy_options)


def run_to_completion(engine: Engine, on_step: Callable[[StepOutput], None] | None = None) -> None:
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
    from andante.models.loader import LoadedModel, load_model
    from andante.models.stopping import StopStrings, truncate_at_stop

    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    tokenizer = loaded.tokenizer
    params = with_eos(sampling or SamplingParams(max_tokens=64, temperature=0.0), tokenizer)
    engine = engine or build_offline_engine(loaded, policy)
    now = engine.clock.now()
    requests = [Request(f"gen-{i}-{time.monotonic_ns()}", encode_prompt(tokenizer, p, chat, system),
                        params, now) for i, p in enumerate(prompts)]
    for req in requests:
        engine.add_request(req)
    stops = StopStrings(tokenizer)  # the front end's stop rule (andante.models.stopping)
    run_to_completion(engine, lambda out: engine.finish_stopped(
        out, [r.request_id for r in out.updated if not r.is_finished and stops(r)]))
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
