"""A model's view of the fleet: one controller per served model, over the upstreams
that serve it.

Design note (QLM §3's "each model on its own instances" when models cannot swap): the
routers (round-robin, least-loaded, power-of-two, ascendra, qlm) place a request among
instances that can all serve it. Upstreams serve fixed models, so each model gets its
own `Controller` over the upstreams serving it, each upstream seen there as a `Member`
(the controller's indices are 0..n-1 per model). An upstream serving two models is a
member of both controllers, and both read the same load: andante's in-flight count on
it covers both. Upstreams that share a device (vLLM's `/sleep` and `/wake_up`, in its
dev mode) are one `SharedDevice` instance, and the models linked by devices share one
controller (`linked_models`), whose qlm router swaps them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from andante.cluster.controller import Controller
from andante.cluster.instance import LaterOperations, ModelState
from andante.cluster.load import LoadReport
from andante.core.request import Request
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.runtime.upstream.instance import UpstreamInstance

BLOCK_SIZE = 16  # of the notional KV cache an upstream's usage is reported in


class Member(LaterOperations):
    """Upstream `upstream` as instance `index` of model `model`'s controller. It reports
    its model (`MultiModel`, for QLM's estimates): the one model, always on the device
    (an upstream neither swaps nor warms models), with the catalog cost model its spec
    names. A request for another model (the router placed it here as refused: no
    upstream of its model is up) goes to `hold` on the next loop turn (as a shared
    device's does: never inside the controller's placement), never to the upstream."""

    def __init__(self, index: int, upstream: UpstreamInstance, model: str,
                 hold: Callable[[Request], None] | None = None) -> None:
        self.index = index
        self._hold = hold
        self.upstream = upstream
        self.model = model
        self.role = upstream.role
        self.capabilities = upstream.capabilities
        spec = upstream.info.spec
        self._cost = CostModel(get_model(spec.cost_model), get_hardware(spec.hardware))

    def model_state(self) -> ModelState:
        hardware = self._cost.hardware
        return ModelState(
            device=self.model, host=(), loading_s=0.0, costs={self.model: self._cost},
            weight_bytes={self.model: self._cost.model.weight_bytes},
            host_link_bandwidth=hardware.host_link_bandwidth,
            disk_bandwidth=hardware.disk_bandwidth, device_memory_bytes=0,
            host_memory_bytes=0, block_size=BLOCK_SIZE)

    def warm_model(self, model: str) -> bool:
        return False

    @property
    def alive(self) -> bool:
        return self.upstream.alive

    def submit(self, req: Request) -> None:
        if req.model and req.model != self.model and self._hold is not None:
            self.upstream.num_received += 1  # received (the controller's in-transit count)
            asyncio.get_running_loop().call_soon(self._hold, req)
            return
        self.upstream.submit(req)

    def abort(self, request_id: str) -> None:
        self.upstream.abort(request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        self.upstream.withdraw(request_ids)

    def load(self) -> LoadReport:
        return self.upstream.load()


@dataclass(slots=True)
class ModelGroup:
    """One model's controller and which member each upstream (by index) is."""

    model: str
    controller: Controller
    members: dict[int, int]  # upstream index -> member index

    def member_of(self, upstream: UpstreamInstance) -> int:
        return self.members[upstream.index]


def linked_models(upstreams: Sequence[UpstreamInstance]) -> list[list[str]]:
    """The served models in sets that share a controller: a model alone, or the models
    of upstreams that share a device (and, transitively, of devices sharing a model)."""
    parent: dict[str, str] = {}

    def root(model: str) -> str:
        while parent[model] != model:
            model = parent[model]
        return model

    for u in upstreams:
        for m in u.models:
            parent.setdefault(m, m)
    for ups in devices_of(upstreams, list(parent)).values():
        first = root(ups[0].models[0])
        for u in ups[1:]:
            parent[root(u.models[0])] = first
    sets: dict[str, list[str]] = {}
    for model in parent:
        sets.setdefault(root(model), []).append(model)
    return list(sets.values())


def devices_of(upstreams: Sequence[UpstreamInstance], models: Sequence[str]
               ) -> dict[str, list[UpstreamInstance]]:
    """The shared devices serving any of `models`: name -> its upstreams, in order."""
    devices: dict[str, list[UpstreamInstance]] = {}
    for u in upstreams:
        if u.info.spec.device:
            devices.setdefault(u.info.spec.device, []).append(u)
    return {d: ups for d, ups in devices.items()
            if any(m in models for u in ups for m in u.models)}
