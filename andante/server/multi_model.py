"""Several models behind one server (`andante serve --model NAME=PATH --model ...`).

Design note (QLM §3 and §5, LSO 5; its decisions are andante.cluster.qlm's): every
in-process instance can serve every model, one at a time on its device. Instance i starts
with model i mod M on the device and the others warm in host memory while they fit
`--host-memory-gib` (`placed_tiers`); the rest stay cold on disk. Requests go to an
instance holding their model (`ModelRouter`), else one swaps to it (`ModelSwitcher`,
driven by the `InstanceWorker`: the outgoing model's unfinished requests are handed
back, never lost). The weights are read once per
process and shared by the instances (in-process instances share them, as with one
model); a cold swap reads the checkpoint again. With `--backend ray` each actor builds
the same worker (`ray_multi_worker`: its own copy of the weights) and the driver keeps
only the tokenizers.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from andante.cluster.qlm.model_router import ModelRouter
from andante.cluster.qlm.tiers import placed_tiers
from andante.cluster.registry import router_entry
from andante.cluster.router import QueueRouter, Router
from andante.core.clock import Clock, MonotonicClock
from andante.core.request import PreemptionMode, Request
from andante.engine import Engine
from andante.engine.config import SchedulerConfig
from andante.engine.stats import EngineLimits
from andante.models.interface import Tokenizer
from andante.perf.cost_model import CostModel
from andante.runtime.clock import WallClock
from andante.runtime.local import MultiModelInstance
from andante.runtime.worker import HostedInstance, InstanceWorker, ModelSwitch, OutputAdapter
from andante.server.config import TOY_MODEL, ServeOptions
from andante.server.runner import ClusterRunner

log = logging.getLogger("andante.server")
GIB = 1 << 30

# (options, instance index, clock, model path, its weights) -> (engine, adapter, name):
# `backend.build_engine_for`
BuildEngine = Callable[[ServeOptions, int, Clock, str | None, Any], tuple[Engine, Any, str]]


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model of the server: its name in the API, its tokenizer, its engine limits."""

    name: str
    tokenizer: Tokenizer
    limits: EngineLimits


class ToyWeights:
    """The toy model's "weights": nothing to load (its swaps measure the engine build)."""


def load_weights(path: str | None, dtype: str) -> Any:
    """A model's weights read from its checkpoint (a cold load)."""
    if path == TOY_MODEL:
        return ToyWeights()
    from andante.models import load_model

    return load_model(path, dtype)


def weight_bytes(weights: Any) -> int:
    """Bytes of a loaded model's tensors in host memory (0 for the toy)."""
    inner = getattr(weights, "weights", None)
    if inner is None:
        return 0
    tensors = [inner.embed, inner.final_norm, inner.lm_head]
    for layer in inner.layers:
        values = (getattr(layer, f.name) for f in dataclasses.fields(layer))
        tensors += [t for t in values if hasattr(t, "element_size")]
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def build_multi_model(options: ServeOptions, router: Router, build_engine: BuildEngine
                      ) -> tuple[ClusterRunner, Mapping[str, ServedModel], Clock]:
    """The runner over multi-model instances (in-process or Ray), and every served model."""
    build = _ray_instances if options.backend == "ray" else _local_instances
    instances, served, clock = build(options, build_engine)
    if not isinstance(router, QueueRouter):  # qlm places by model itself
        router = ModelRouter(router, instances)
    return ClusterRunner(list[HostedInstance](instances), router), served, clock


_Built = tuple[list[Any], Mapping[str, ServedModel], Clock]  # HostedInstance & ModelHolder


def _local_instances(options: ServeOptions, build_engine: BuildEngine) -> _Built:
    clock = MonotonicClock()
    costs: dict[str, CostModel] = {}  # filled below; read by the workers at swap time
    limits: dict[str, EngineLimits] = {}
    weights = _load_all(options)
    workers = [_worker(options, i, clock, weights, build_engine, (costs, limits))
               for i in range(options.instances)]
    served = _describe(options, clock, weights, build_engine, workers, (costs, limits))
    return [MultiModelInstance(w) for w in workers], served, clock


def _load_all(options: ServeOptions) -> Mapping[str, Any]:
    return {name: load_weights(path, options.engine.dtype) for name, path in options.models}


def ray_multi_worker(options: ServeOptions, build_engine: BuildEngine, origin: float,
                     index: int) -> InstanceWorker:
    """The factory each Ray actor calls: the worker of instance `index` over its own
    copy of the weights, with every model's cost model and limits."""
    clock = WallClock(origin)
    costs: dict[str, CostModel] = {}
    limits: dict[str, EngineLimits] = {}
    weights = _load_all(options)
    worker = _worker(options, index, clock, weights, build_engine, (costs, limits))
    _describe(options, clock, weights, build_engine, [worker], (costs, limits))
    return worker


def _ray_instances(options: ServeOptions, build_engine: BuildEngine) -> _Built:
    from andante.runtime.ray_actors import RayMultiModelInstance, init_ray

    init_ray(options.ray_address)
    clock = WallClock()
    factory = functools.partial(ray_multi_worker, options, build_engine, clock.origin)
    spread = options.ray_address != "local"
    instances = [RayMultiModelInstance(i, factory, "", options.max_restarts, spread)
                 for i in range(options.instances)]
    limits = [inst.describe_models() for inst in instances][0]  # waits for the actors
    served = {name: ServedModel(name, _tokenizer(path), limits[name])
              for name, path in options.models}
    return instances, served, clock


def _tokenizer(path: str | None) -> Tokenizer:
    if path == TOY_MODEL:
        from andante.server.toy import ByteTokenizer

        return ByteTokenizer()
    from andante.models.loader import load_tokenizer

    return load_tokenizer(path)


_Known = tuple[dict[str, CostModel], dict[str, EngineLimits]]  # filled by `_describe`


def _worker(options: ServeOptions, index: int, clock: Clock, weights: Mapping[str, Any],
            build_engine: BuildEngine, known: _Known) -> InstanceWorker:
    """Instance `index`, its models placed by andante.cluster.qlm.tiers' `placed_tiers`
    (its warm models keep the weights loaded here; the others' are dropped)."""
    paths = dict(options.models)
    cap = None if options.host_memory_gib is None else int(options.host_memory_gib * GIB)

    choose = router_entry(options.router).hook("preemption")

    def build(model: str, loaded: Any) -> tuple[Engine, OutputAdapter]:
        engine, adapter, _ = build_engine(options, index, clock, paths[model],
                                          _shared(loaded))
        if choose is not None:  # each victim evicted or swapped by cost (QLM)
            engine.scheduler.preemption_mode_of = _by_cost(choose, known[0], model,
                                                           engine.scheduler.config)
        return engine, adapter

    def load(model: str) -> Any:
        return load_weights(paths[model], options.engine.dtype)

    tiers = placed_tiers(index, {name: weight_bytes(weights[name]) for name in paths}, cap)
    device = tiers.device
    tiers.weights.update((m, weights[m]) for m in (device, *tiers.host))
    engine, adapter = build(device, weights[device])
    log.info("instance %d: %s on the device, warm: %s", index, device,
             ", ".join(tiers.host) or "none")
    return InstanceWorker(index, engine, adapter, model_name=device,
                          switch=ModelSwitch(tiers, build, load, *known))


def _by_cost(choose: Callable[[CostModel], Callable[[Request], PreemptionMode]],
             costs: Mapping[str, CostModel], model: str, config: SchedulerConfig
             ) -> Callable[[Request], PreemptionMode]:
    """The router's per-request preemption rule on `model`'s cost model (known once the
    models are described; until then the configured mode)."""
    rule: list[Callable[[Request], PreemptionMode]] = []

    def mode_of(req: Request) -> PreemptionMode:
        if not rule and model in costs:
            rule.append(choose(costs[model]))
        return rule[0](req) if rule else config.preemption_mode

    return mode_of


def _shared(loaded: Any) -> Any:
    return None if isinstance(loaded, ToyWeights) else loaded


def _describe(options: ServeOptions, clock: Clock, weights: Mapping[str, Any],
              build_engine: BuildEngine, workers: list[InstanceWorker],
              known: _Known) -> dict[str, ServedModel]:
    """Each model's tokenizer, limits and cost model: from a worker's engine where one
    serves it, else from an engine built once for it (a model no device holds yet)."""
    served: dict[str, ServedModel] = {}
    costs, limits = known

    def record(name: str, engine: Engine, adapter: Any) -> None:
        served[name] = ServedModel(name, adapter.tokenizer, engine.limits())
        costs[name], limits[name] = engine.executor.cost_model, served[name].limits

    for worker in workers:
        if worker.model_name not in served:
            record(worker.model_name, worker.engine, worker.adapter)
    for name, path in options.models:
        if name not in served:
            engine, adapter, _ = build_engine(options, 0, clock, path, _shared(weights[name]))
            record(name, engine, adapter)
    return {name: served[name] for name, _ in options.models}
