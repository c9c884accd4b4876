"""Build the serving backend (engine + tokenizer) from a model path: the one function
the server, the CLI and the tests go through.

`model=None` loads the embedded default model (SmolLM2-135M-Instruct, on the CPU);
a path loads that checkpoint; `"toy"` builds the byte-level toy backend
(`andante.server.toy`), which needs no weights and answers in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from andante.core.clock import MonotonicClock
from andante.engine import Engine
from andante.exec.base import Executor
from andante.llm import build_engine
from andante.models.interface import Tokenizer
from andante.policies import SchedulerConfig
from andante.server.config import TOY_MODEL, EngineOptions, ServeOptions
from andante.server.outputs import OutputProcessor
from andante.server.toy import ByteTokenizer, ToyExecutor

TOY_MAX_MODEL_LEN = 4096
GIB = 1 << 30


@dataclass(slots=True)
class Backend:
    engine: Engine
    tokenizer: Tokenizer
    outputs: OutputProcessor
    model_name: str
    max_model_len: int
    runner: Any = None  # a multi-instance server's runner (andante.server.cluster_runner)

    @property
    def kv_capacity_tokens(self) -> int:
        kv = self.engine.scheduler.kv
        return kv.num_device_blocks * kv.block_size


def build_backend(options: ServeOptions) -> Backend:
    if options.instances > 1 or options.backend == "ray":
        from andante.server.cluster import build_cluster_backend

        return build_cluster_backend(options)
    tokenizer, executor, name, model_len = engine_parts(options.model, options.engine)
    outputs = OutputProcessor()
    config = scheduler_config(options.engine, model_len)
    engine = build_engine(
        executor, MonotonicClock(), options.policy, config, dict(options.policy_options)
    )
    served = options.served_model_name or name
    return Backend(engine, tokenizer, outputs, served, config.max_model_len)


def scheduler_config(opts: EngineOptions, model_len: int) -> SchedulerConfig:
    max_len = min(opts.max_model_len or model_len, model_len)
    return SchedulerConfig(
        block_size=opts.block_size,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=max(opts.max_num_batched_tokens or max_len, max_len),
        max_model_len=max_len,
        preemption_mode=opts.preemption_mode,
    )


def engine_parts(model: str | None, opts: EngineOptions, loaded: Any = None
                 ) -> tuple[Tokenizer, Executor, str, int]:
    """(tokenizer, executor, model name, context) of the toy or a real model; `loaded`
    reuses weights already loaded (several in-process instances share them)."""
    if model == TOY_MODEL:
        return _toy_parts(opts)
    return _model_parts(model, opts, loaded)


def _toy_parts(opts: EngineOptions) -> tuple[Tokenizer, Executor, str, int]:
    executor = ToyExecutor(num_device_blocks=opts.num_kv_blocks or 4096,
                           step_time=opts.toy_step_time)
    return ByteTokenizer(), executor, TOY_MODEL, TOY_MAX_MODEL_LEN


def _model_parts(path: str | None, opts: EngineOptions, loaded: Any = None
                 ) -> tuple[Tokenizer, Executor, str, int]:
    """The real engine: `andante.models.load_model` + `TorchExecutor` (torch imported here,
    so the toy backend and the web layer stay light)."""
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models import load_model

    loaded = loaded or load_model(path, opts.dtype)
    kv_gib = opts.kv_cache_gib
    if opts.num_kv_blocks is not None:
        itemsize = 4 if opts.dtype == "float32" else 2
        block_bytes = loaded.config.kv_bytes_per_token(itemsize) * opts.block_size
        kv_gib = (opts.num_kv_blocks + 0.5) * block_bytes / GIB
    executor = TorchExecutor(loaded, TorchExecutorOptions(
        dtype=opts.dtype, num_threads=opts.num_threads, kv_cache_gib=kv_gib,
        swap_space_gib=opts.swap_space_gib, block_size=opts.block_size,
        max_model_len=opts.max_model_len,
    ))
    return loaded.tokenizer, executor, loaded.name, executor.max_model_len
