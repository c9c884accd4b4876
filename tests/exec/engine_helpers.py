"""Drive the real engine over a TorchExecutor on a tiny model, in tests."""

from __future__ import annotations

from typing import Any

import torch

from andante.core import ManualClock, Request, SamplingParams
from andante.engine import Engine
from andante.exec.batch import StepBatch, StepResult
from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
from andante.llm import build_engine
from andante.models.loader import LoadedModel
from andante.policies import SchedulerConfig

GIB = 1 << 30


def kv_gib_for_blocks(model: LoadedModel, num_blocks: int, block_size: int = 16) -> float:
    return num_blocks * block_size * model.config.with_dtype(4).kv_bytes_per_token / GIB


def tiny_executor(model: LoadedModel, device_blocks: int = 64, host_blocks: int = 64,
                  **options: Any) -> TorchExecutor:
    options.setdefault("dtype", "float32")
    options.setdefault("layer_form", "plain")  # not timed: the same form in every process
    if options["dtype"] == "bfloat16":  # likewise the attention paths
        options.setdefault("prefill_attention", "matmul")
        options.setdefault("decode_attention", "matmul_native")
    opts = TorchExecutorOptions(
        kv_cache_gib=kv_gib_for_blocks(model, device_blocks) + 1e-9,
        swap_space_gib=kv_gib_for_blocks(model, host_blocks) + 1e-9, **options)
    return TorchExecutor(model, opts)


class ScramblingExecutor:
    """Wraps a TorchExecutor; after each swap-out, fills the freed device blocks with
    noise so a swap-in can only restore the request from the host copy."""

    def __init__(self, inner: TorchExecutor) -> None:
        self.inner = inner
        self.cost_model = inner.cost_model
        self.swap_times: list[float] = []

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return self.inner.num_kv_blocks(block_size)

    def execute(self, batch: StepBatch) -> StepResult:
        result = self.inner.execute(batch)
        if batch.swap_out:
            src = torch.tensor([d for d, _ in batch.swap_out])
            pool = self.inner.kv.device
            pool[:, :, src] = torch.randn_like(pool[:, :, src])
            self.swap_times.append(result.swap_time)
        return result


def run_engine(executor: Any, prompts: list[list[int]], max_tokens: int,
               policy: str = "vllm", policy_options: dict[str, Any] | None = None,
               config: SchedulerConfig | None = None, arrivals: list[int] | None = None,
               sampling: SamplingParams | None = None) -> tuple[list[Request], Engine]:
    """Greedy-generate `max_tokens` for each prompt; prompt i joins at step arrivals[i]."""
    clock = ManualClock()
    config = config or SchedulerConfig(max_model_len=512, max_num_batched_tokens=512)
    engine = build_engine(executor, clock, policy, config, policy_options)
    params = sampling or SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                        ignore_eos=True)
    requests = [Request(f"r{i}", p, params, 0.0) for i, p in enumerate(prompts)]
    arrivals = arrivals or [0] * len(prompts)
    step = 0
    while step <= max(arrivals) or engine.has_work:
        for req, at in zip(requests, arrivals, strict=True):
            if at == step:
                engine.add_request(req)
        engine.step()
        clock.advance_to(clock.now() + 0.01)
        step += 1
    return requests, engine
