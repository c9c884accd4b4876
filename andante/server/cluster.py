"""`andante serve --instances N`: N engines behind the cluster controller.

Each instance is an `andante.cluster.InstanceWorker` over its own engine (its own KV
cache; in-process instances share the loaded weights) whose outputs are this server's
detokenized `Delta`s. In-process, every worker runs in a thread of this process; with
`--backend ray` in a Ray actor built by `ray_worker` (a top-level function, so Ray can
ship it to any node). The HTTP layer sees a `Backend` whose `engine` is a probe that is
never stepped — it answers admission checks (context and KV limits) and gives the shared
clock — and whose `runner` is a `ClusterRunner` (andante.server.cluster_runner).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from andante.cluster.clock import WallClock
from andante.cluster.registry import make_router
from andante.cluster.worker import InstanceWorker
from andante.core.clock import Clock, MonotonicClock
from andante.core.request import Request
from andante.engine import Engine, StepOutput
from andante.exec.batch import StepBatch, StepResult
from andante.llm import build_engine
from andante.models.interface import Tokenizer
from andante.server.backend import Backend, engine_parts, scheduler_config
from andante.server.config import TOY_MODEL, ServeOptions
from andante.server.outputs import Delta, OutputProcessor
from andante.server.toy import ByteTokenizer


@dataclass(frozen=True, slots=True)
class InstancePlan:
    role: str
    policy: str
    policy_options: dict[str, Any]
    max_num_seqs: int


def instance_plans(options: ServeOptions) -> list[InstancePlan]:
    """Roles and policies: `ascendra` splits the instances into LP and HP pools
    (`--policy-option lp.KEY=V` / `hp.KEY=V` reach one pool); otherwise every instance
    runs `options.policy`."""
    n, seqs = options.instances, options.engine.max_num_seqs
    if options.router != "ascendra":
        return [InstancePlan("", options.policy, dict(options.policy_options), seqs)] * n
    num_hp = options.hp_instances
    if not 1 <= num_hp < n:
        raise ValueError(f"router 'ascendra' needs 1 <= hp_instances < instances, got "
                         f"{num_hp} of {n}")
    pools: dict[str, dict[str, Any]] = {"lp": {}, "hp": {}}
    for key, value in options.policy_options.items():
        pool, _, name = key.partition(".")
        if pool not in pools or not name:
            raise ValueError(f"router 'ascendra': policy option {key!r} must start with "
                             "'lp.' or 'hp.'")
        pools[pool][name] = value
    lp = InstancePlan("lp", "ascendra-lp", pools["lp"], seqs)
    hp = InstancePlan("hp", "ascendra-hp", pools["hp"], 4 * seqs)  # the elastic batch
    return [lp] * (n - num_hp) + [hp] * num_hp


class DeltaAdapter:
    """`OutputAdapter` of the server: incremental detokenization into `Delta`s."""

    def __init__(self, tokenizer: Tokenizer, outputs: OutputProcessor) -> None:
        self.tokenizer = tokenizer
        self.processor = outputs

    def register(self, req: Request) -> None:
        decoder = self.tokenizer.incremental_decoder(skip_special_tokens=True)
        self.processor.register(req.request_id, decoder, tuple(req.sampling.stop))

    def stopped(self, step: StepOutput) -> list[str]:
        return self.processor.stopped(step)

    def outputs(self, step: StepOutput) -> list[Any]:
        return list(self.processor.deltas(step))

    def discard(self, request_id: str) -> None:
        self.processor.discard(request_id)


def build_worker(options: ServeOptions, index: int, clock: Clock,
                 loaded: Any = None) -> InstanceWorker:
    """Instance `index` of the plan, on `clock`; `loaded`: weights to share, if any."""
    plan = instance_plans(options)[index]
    opts = replace(options.engine, max_num_seqs=plan.max_num_seqs)
    tokenizer, executor, name, model_len = engine_parts(options.model, opts, loaded)
    outputs = OutputProcessor()
    engine = build_engine(executor, clock, plan.policy, scheduler_config(opts, model_len),
                          plan.policy_options)
    return InstanceWorker(index, engine, DeltaAdapter(tokenizer, outputs),
                          model_name=name)


def ray_worker(options: ServeOptions, origin: float, index: int) -> InstanceWorker:
    """The factory each Ray actor calls (it loads its own copy of the model)."""
    return build_worker(options, index, WallClock(origin))


class _ProbeExecutor:
    """Never runs: sizes the probe engine's KV cache like the instances'."""

    cost_model: Any = None

    def __init__(self, num_device_blocks: int, num_host_blocks: int) -> None:
        self._blocks = (num_device_blocks, num_host_blocks)

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return self._blocks

    def execute(self, batch: StepBatch) -> StepResult:
        raise RuntimeError("the probe engine never steps")


def _probe(like: Engine, clock: Clock) -> Engine:
    kv = like.scheduler.kv
    executor = _ProbeExecutor(kv.num_device_blocks, kv.host.num_blocks)
    return build_engine(executor, clock, "vllm", like.scheduler.config)


def build_cluster_backend(options: ServeOptions) -> Backend:
    """The backend of a multi-instance server (in-process threads or Ray actors)."""
    from andante.server.cluster_runner import ClusterRunner

    plans = instance_plans(options)
    router = make_router(options.router, dict(options.router_options))
    if options.backend == "ray":
        instances, probe, tokenizer, name = _ray_instances(options, plans)
    else:
        instances, probe, tokenizer, name = _local_instances(options, plans)
    runner = ClusterRunner(instances, router)
    served = options.served_model_name or name
    return Backend(probe, tokenizer, OutputProcessor(), served,
                   probe.scheduler.config.max_model_len, runner=runner)


def _local_instances(options: ServeOptions, plans: list[InstancePlan]
                     ) -> tuple[list[Any], Engine, Tokenizer, str]:
    from andante.cluster.local import LocalInstance

    clock = MonotonicClock()
    loaded = None
    if options.model != TOY_MODEL:
        from andante.models import load_model

        loaded = load_model(options.model, options.engine.dtype)
    workers = [build_worker(options, i, clock, loaded) for i in range(options.instances)]
    instances = [LocalInstance(w, p.role) for w, p in zip(workers, plans, strict=True)]
    adapter = workers[0].adapter
    assert isinstance(adapter, DeltaAdapter)
    return instances, _probe(workers[0].engine, clock), adapter.tokenizer, workers[0].model_name


def _ray_instances(options: ServeOptions, plans: list[InstancePlan]
                   ) -> tuple[list[Any], Engine, Tokenizer, str]:
    from andante.cluster.ray_backend import RayInstance, init_ray

    init_ray(options.ray_address)
    clock = WallClock()
    factory = functools.partial(ray_worker, options, clock.origin)
    spread = options.ray_address != "local"
    instances = [RayInstance(i, factory, p.role, options.max_restarts, spread)
                 for i, p in enumerate(plans)]
    num_device, num_host, config, name = instances[0].describe()  # waits for its model
    probe = build_engine(_ProbeExecutor(num_device, num_host), clock, "vllm", config)
    if options.model == TOY_MODEL:
        tokenizer: Tokenizer = ByteTokenizer()
    else:
        from andante.models.loader import load_tokenizer

        tokenizer = load_tokenizer(options.model)
    return instances, probe, tokenizer, name


def error_delta(request_id: str) -> Delta:
    """What a request gets when its instance died after it had streamed tokens."""
    return Delta(request_id, "", 0, 0, finish_reason="error")
