"""Build andante's policy for a vLLM engine: its limits, cost model and options.

The policy is andante's own registered class (andante.policies.registry), given the
engine's budgets as a `SchedulerConfig` (vLLM's block size, max_num_seqs,
max_num_batched_tokens, max_model_len, watermark; recompute preemption, vLLM v1 having
no swap), the options a policy needs to preempt by recompute (FastServe's kv_mode
"recompute" instead of its proactive swapping) under the user's `policy_options`, and
a cost model of the served model on the named hardware profile.
"""

from __future__ import annotations

import logging
from typing import Any

from andante.core.clock import Clock
from andante.core.request import PreemptionMode
from andante.engine.config import SchedulerConfig
from andante.engine.policy import Policy, PolicyContext
from andante.perf.cost_model import CostModel
from andante.policies.registry import make_policy, policy_class
from andante.vllm.config import AdapterConfig, ConfigError

logger = logging.getLogger("vllm.andante")  # under vLLM's configured logger


def scheduler_config(vllm_config: Any, block_size: int, max_num_scheduled_tokens: int,
                     ) -> SchedulerConfig:
    sched = vllm_config.scheduler_config
    return SchedulerConfig(
        block_size=block_size, max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=max_num_scheduled_tokens,
        max_model_len=vllm_config.model_config.max_model_len,
        watermark=float(getattr(sched, "watermark", 0.0) or 0.0),
        preemption_mode=PreemptionMode.RECOMPUTE,
        enable_prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
    )


def cost_model(vllm_config: Any, hardware: str | None, on_cpu: bool) -> CostModel | None:
    """The served model on `hardware` (default: andante's `cpu` profile on vLLM's CPU
    build, none elsewhere); None, with a warning, for a model andante cannot describe."""
    from andante.exec.torch_cost import CPU_PROFILE, cpu_hardware
    from andante.models.config import config_from_hf
    from andante.perf.catalog import get_hardware, hardware_names

    name = hardware or (CPU_PROFILE if on_cpu else None)
    if name is None:
        return None
    if name == CPU_PROFILE:
        spec_hw = cpu_hardware()[0]
    elif name in hardware_names():
        spec_hw = get_hardware(name)
    else:
        raise ConfigError(f"unknown hardware profile {name!r}; choose one of "
                          f"{', '.join(hardware_names())}")
    model = vllm_config.model_config
    try:
        spec = config_from_hf(model.hf_config.to_dict(), model.served_model_name or "model")
    except (ValueError, KeyError) as exc:
        logger.warning("andante.vllm: no cost model for this model (%s)", exc)
        return None
    spec = spec.with_dtype(int(model.dtype.itemsize))
    return CostModel(spec, spec_hw, tp=vllm_config.parallel_config.tensor_parallel_size)


def build_policy(adapter: AdapterConfig, config: SchedulerConfig, clock: Clock,
                 costs: CostModel | None) -> Policy:
    """andante's policy `adapter.policy`, or a ConfigError saying why it cannot run."""
    cls: Any = policy_class(adapter.policy)
    options = {**cls.preemption_options(PreemptionMode.RECOMPUTE), **adapter.policy_options}
    try:
        policy = make_policy(adapter.policy, PolicyContext(clock, config, costs, options))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    chunks = getattr(policy, "chunks_prefill", False)
    if config.max_num_batched_tokens < config.max_model_len and not chunks:
        raise ConfigError(
            f"policy {adapter.policy!r} prefills whole prompts: --max-num-batched-tokens "
            f"({config.max_num_batched_tokens}) must be >= --max-model-len "
            f"({config.max_model_len})")
    return policy
