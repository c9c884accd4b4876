"""Build the serving backend from the options: the one function the server, the CLI and
the tests go through.

Design note (DESIGN.md rule 6, "one way to serve"): every server is a cluster — the
controller (andante.cluster) over `--instances N` instances, one by default. Each
instance is an `InstanceWorker` over its own engine (its own KV cache; in-process
instances share the loaded weights) whose outputs are this server's detokenized
`Delta`s; it runs in a thread of this process (andante.runtime.local) or, with
`--backend ray`, in a Ray actor built by `ray_worker` (a top-level function, so Ray can
ship it to any node). The HTTP layer sees the runner, the tokenizer and the engines'
`EngineLimits`, which admission checks requests against at the edge.

`model=None` loads the embedded default model (SmolLM2-135M-Instruct, on the CPU); a
path loads that checkpoint; `"toy"` builds the byte-level toy backend
(`andante.server.toy`), which needs no weights and answers in milliseconds.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from andante.cluster.registry import PoolMember, make_router, router_entry
from andante.core.clock import Clock, MonotonicClock
from andante.core.request import Request
from andante.engine import Engine, StepOutput
from andante.engine.config import SchedulerConfig
from andante.engine.stats import EngineLimits
from andante.exec.base import Executor
from andante.llm import build_engine
from andante.models.interface import Tokenizer
from andante.runtime.clock import WallClock
from andante.runtime.step_trace import StepTrace
from andante.runtime.worker import HostedInstance, InstanceWorker
from andante.server.config import TOY_MODEL, EngineOptions, ServeOptions
from andante.server.kv_budget import available_memory, plan_kv
from andante.server.multi_model import ServedModel, build_multi_model
from andante.server.outputs import OutputProcessor
from andante.server.runner import ClusterRunner
from andante.server.toy import ByteTokenizer, ToyExecutor

log = logging.getLogger("andante.server")
TOY_MAX_MODEL_LEN = 4096
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Backend:
    """What the HTTP layer serves from; `clock` stamps arrivals (the instances' clock).
    The default model is `model_name` (with its `tokenizer` and `limits`); `others`:
    the other models of `--model NAME=PATH ...`, by name."""

    runner: ClusterRunner
    tokenizer: Tokenizer
    model_name: str
    limits: EngineLimits
    clock: Clock
    others: Mapping[str, ServedModel] = field(default_factory=dict)  # the other models

    @property
    def served(self) -> dict[str, ServedModel]:
        """Every model by name, the default first."""
        first = ServedModel(self.model_name, self.tokenizer, self.limits)
        return {self.model_name: first, **self.others}


def build_backend(options: ServeOptions) -> Backend:
    """The controller over `options.instances` in-process threads or Ray actors."""
    router = make_router(options.router, dict(options.router_options))
    if options.models:
        runner, served, clock = build_multi_model(options, router, build_engine_for)
        first, *others = served.values()
        return Backend(runner, first.tokenizer, first.name, first.limits, clock,
                       {m.name: m for m in others})
    plans = instance_plans(options)
    build = {"ray": _ray_instances, "process": _process_instances}.get(options.backend,
                                                                       _local_instances)
    instances, limits, tokenizer, name, clock = build(options, plans)
    name = options.served_model_name or name
    serve_operators = router_entry(options.router).hook("serve_operators")
    operators = [] if serve_operators is None else serve_operators(router, instances)
    return Backend(ClusterRunner(instances, router, operators), tokenizer, name, limits, clock)


def instance_plans(options: ServeOptions) -> list[PoolMember]:
    """Roles and policies: a router with pools splits the instances into them (ascendra:
    its LP and HP pools, `--policy-option lp.KEY=V` / `hp.KEY=V` reach one pool);
    otherwise every instance runs `options.policy`."""
    pool_plan = router_entry(options.router).hook("pool_plan")
    if pool_plan is not None:
        plan: list[PoolMember] = pool_plan(options.instances, options.hp_instances,
                                           options.policy_options)
        return plan
    return [PoolMember("", options.policy, dict(options.policy_options))] * options.instances


class DeltaAdapter:
    """`OutputAdapter` of the server: incremental detokenization into `Delta`s."""

    def __init__(self, tokenizer: Tokenizer, outputs: OutputProcessor) -> None:
        self.tokenizer = tokenizer
        self.processor = outputs
        self.trace: StepTrace | None = None  # `--trace-steps`: told when a request is in

    def register(self, req: Request) -> None:
        if self.trace is not None:
            self.trace.seen(req)
        decoder = self.tokenizer.incremental_decoder(skip_special_tokens=True)
        self.processor.register(req.request_id, decoder, tuple(req.sampling.stop))
        if req.output_token_ids:  # resumed after a model swap: its text so far was sent
            self.processor.resume(req)

    def stopped(self, step: StepOutput) -> list[str]:
        return self.processor.stopped(step)

    def outputs(self, step: StepOutput) -> list[Any]:
        return list(self.processor.deltas(step))

    def discard(self, request_id: str) -> None:
        self.processor.discard(request_id)


def build_worker(options: ServeOptions, index: int, clock: Clock,
                 loaded: Any = None) -> InstanceWorker:
    """Instance `index` of the plan, on `clock`; `loaded`: weights to share, if any."""
    engine, adapter, name = build_engine_for(options, index, clock, options.model, loaded)
    if options.trace_steps:
        adapter.trace = start_trace(engine, clock, options.trace_steps, index)
    return InstanceWorker(index, engine, adapter, model_name=name)


def start_trace(engine: Engine, clock: Clock, path: str, index: int) -> StepTrace:
    """Trace `engine`'s steps and requests to `path` (instance i > 0: `path.i`)."""
    target = Path(path if index == 0 else f"{path}.{index}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("", encoding="utf-8")  # a new trace; appended to from here on,
    # by the trace and by the HTTP timing middleware (andante.server.http_timing)
    trace = StepTrace(target.open("a", buffering=1, encoding="utf-8"), clock,
                      threads=_step_threads(engine))
    engine.add_observer(trace)
    trace.watch_gc()
    return trace


def _step_threads(engine: Engine) -> Callable[[], int] | None:
    """A reader of the threads a torch executor's last step ran on (it sets them in the
    stepping thread, where the trace reads them); None for other executors."""
    if not type(engine.executor).__module__.startswith("andante.exec.torch"):
        return None
    import torch

    return torch.get_num_threads


def build_engine_for(options: ServeOptions, index: int, clock: Clock, model: str | None,
                     loaded: Any = None) -> tuple[Engine, DeltaAdapter, str]:
    """The engine of instance `index` of the plan serving `model` (a path, None or
    "toy"), its output adapter and the model's own name."""
    plan = instance_plans(options)[index]
    opts = replace(options.engine, max_num_seqs=plan.batch_factor * options.engine.max_num_seqs)
    tokenizer, executor, name, model_len = engine_parts(model, opts, loaded)
    engine = build_engine(executor, clock, plan.policy, scheduler_config(opts, model_len),
                          plan.policy_options)
    return engine, DeltaAdapter(tokenizer, OutputProcessor()), name


def ray_worker(options: ServeOptions, origin: float, index: int) -> InstanceWorker:
    """The factory each Ray actor calls (it loads its own copy of the model)."""
    return build_worker(options, index, WallClock(origin))


_Built = tuple[list[HostedInstance], EngineLimits, Tokenizer, str, Clock]


def _local_instances(options: ServeOptions, plans: list[PoolMember]) -> _Built:
    from andante.runtime.local import LocalInstance

    clock = MonotonicClock()
    loaded = None
    if options.model != TOY_MODEL:
        from andante.models import load_model

        loaded = load_model(options.model, options.engine.dtype)
    workers = [build_worker(options, i, clock, loaded) for i in range(options.instances)]
    instances: list[HostedInstance] = [LocalInstance(w, p.role)
                                       for w, p in zip(workers, plans, strict=True)]
    adapter = workers[0].adapter
    assert isinstance(adapter, DeltaAdapter)
    limits, name = workers[0].describe()
    return instances, limits, adapter.tokenizer, name, clock


def _process_instances(options: ServeOptions, plans: list[PoolMember]) -> _Built:
    """One engine process per instance (andante.runtime.process), each loading its own
    copy of the model; this process keeps the tokenizer only."""
    from andante.runtime.process import ProcessInstance

    clock = WallClock()
    factory = functools.partial(ray_worker, options, clock.origin)
    level = logging.getLogger("andante").getEffectiveLevel()
    instances = [ProcessInstance(i, factory, p.role, level) for i, p in enumerate(plans)]
    try:
        limits, name = instances[0].describe()  # waits for its model
        for inst in instances[1:]:
            inst.describe()
    except BaseException:
        for inst in instances:
            inst.stop(timeout=5.0)
        raise
    return list[HostedInstance](instances), limits, _tokenizer(options), name, clock


def _tokenizer(options: ServeOptions) -> Tokenizer:
    if options.model == TOY_MODEL:
        return ByteTokenizer()
    from andante.models.loader import load_tokenizer

    return load_tokenizer(options.model)


def _ray_instances(options: ServeOptions, plans: list[PoolMember]) -> _Built:
    from andante.runtime.ray_actors import RayInstance, init_ray

    init_ray(options.ray_address)
    clock = WallClock()
    factory = functools.partial(ray_worker, options, clock.origin)
    spread = options.ray_address != "local"
    instances = [RayInstance(i, factory, p.role, options.max_restarts, spread)
                 for i, p in enumerate(plans)]
    limits, name = instances[0].describe()  # waits for its model
    return list[HostedInstance](instances), limits, _tokenizer(options), name, clock


def scheduler_config(opts: EngineOptions, model_len: int) -> SchedulerConfig:
    max_len = min(opts.max_model_len or model_len, model_len)
    return SchedulerConfig(
        block_size=opts.block_size,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=max(opts.max_num_batched_tokens or max_len, max_len),
        max_model_len=max_len,
        preemption_mode=opts.preemption_mode,
        enable_prefix_caching=opts.enable_prefix_caching,
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
    token_bytes = loaded.config.with_dtype(4 if opts.dtype == "float32" else 2).kv_bytes_per_token
    kv_gib = opts.kv_cache_gib
    if opts.num_kv_blocks is not None:
        kv_gib = (opts.num_kv_blocks + 0.5) * token_bytes * opts.block_size / GIB
    elif kv_gib is None:
        model_len = min(opts.max_model_len or loaded.config.max_model_len,
                        loaded.config.max_model_len)
        budget = plan_kv(token_bytes, model_len, opts.max_num_seqs, available_memory())
        log.info("%s", budget.describe())
        kv_gib = budget.gib + 0.5 * token_bytes * opts.block_size / GIB
    executor = TorchExecutor(loaded, TorchExecutorOptions(
        dtype=opts.dtype, num_threads=opts.num_threads, kv_cache_gib=kv_gib,
        swap_space_gib=opts.swap_space_gib, block_size=opts.block_size,
        max_model_len=opts.max_model_len,
    ))
    return loaded.tokenizer, executor, loaded.name, executor.max_model_len
