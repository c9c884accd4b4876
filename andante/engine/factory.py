"""Assemble an engine: block manager sized by the executor, policy by name."""

from __future__ import annotations

from typing import Any

from andante.core.clock import Clock
from andante.engine.engine import Engine
from andante.engine.scheduler import Scheduler
from andante.engine.stopping import StopChecker
from andante.exec.base import Executor
from andante.kv.block_manager import KVBlockManager
from andante.policies.base import PolicyContext
from andante.policies.config import SchedulerConfig
from andante.policies.registry import make_policy


def build_engine(
    executor: Executor,
    clock: Clock,
    policy: str = "vllm",
    config: SchedulerConfig | None = None,
    policy_options: dict[str, Any] | None = None,
    stop_checker: StopChecker | None = None,
) -> Engine:
    config = config or SchedulerConfig()
    num_device, num_host = executor.num_kv_blocks(config.block_size)
    if num_device < 1:
        raise ValueError("the executor has no room for a single KV block")
    kv = KVBlockManager(config.block_size, num_device, num_host, config.watermark)
    ctx = PolicyContext(clock, config, executor.cost_model, dict(policy_options or {}))
    scheduler = Scheduler(config, kv, make_policy(policy, ctx), clock, stop_checker)
    return Engine(scheduler, executor, clock)
