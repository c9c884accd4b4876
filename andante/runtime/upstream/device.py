"""Upstreams that share one device: one cluster instance whose model QLM swaps.

Design note (QLM §5 LSO 5, model swapping; vLLM's dev-mode sleep). Servers started on
one device, each with its own model (vLLM with `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`, andante with `--dev-mode`), take turns: one is awake, the
others sleep at level 1 (weights held in host memory, KV cache released). To the
controller the device is one instance serving all their models (`MultiModel`): the
awake server's model is on the device, the sleeping ones' are in host memory, and
`swap_model` is QLM's swap: the requests in flight on the awake server finish, it is put
to sleep (`POST /sleep?level=1`), the target is woken (`POST /wake_up`). Requests the
router places meanwhile, or for a model that is not awake, are parked here and sent
when their model wakes (never failed); a swap that fails hands them back to the
controller. The load the router sees is the awake server's, the parked requests
counted as waiting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

from andante.cluster.instance import BASIC_CAPABILITIES, SWAP_MODEL, LaterOperations, ModelState
from andante.cluster.load import LoadReport
from andante.core.request import Request
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.runtime.upstream.instance import UpstreamInstance

log = logging.getLogger("andante.fleet")
BLOCK_SIZE = 16
SLEEP_LEVEL = 1
DRAIN_POLL_S = 0.01
INITIAL_SWAP_S = 1.0  # the estimate until a swap has been measured

# POST a path (with query) to an upstream's URL; returns the status (raises on failure)
PostFn = Callable[[str, str], Awaitable[int]]


class SharedDevice(LaterOperations):
    capabilities = BASIC_CAPABILITIES | {SWAP_MODEL}

    def __init__(self, index: int, name: str, upstreams: Sequence[UpstreamInstance],
                 awake: int, post: PostFn, on_swapped: Callable[[SharedDevice], None],
                 hand_back: Callable[[SharedDevice, list[Request]], None]) -> None:
        self.index = index
        self.name = name
        self.upstreams = list(upstreams)
        self.by_model = {u.models[0]: u for u in self.upstreams}
        self.awake = self.upstreams[awake]
        self.role = self.awake.role
        self._post = post
        self._on_swapped = on_swapped
        self._hand_back = hand_back
        self.target: str | None = None  # the model being swapped in
        self.parked: list[Request] = []
        self.num_received = 0  # every request handed here (the controller's in-transit)
        self.swap_s = INITIAL_SWAP_S
        self.num_swaps = 0
        self._swap_started = 0.0
        self._task: asyncio.Task[None] | None = None
        self._costs = {u.models[0]: CostModel(get_model(u.info.spec.cost_model),
                                              get_hardware(u.info.spec.hardware))
                       for u in self.upstreams}

    @property
    def model(self) -> str:
        return self.awake.models[0]

    # ---- MultiModel ---------------------------------------------------------------------
    def model_state(self) -> ModelState:
        device = self.target or self.model
        loading = 0.0
        if self.target is not None:
            elapsed = asyncio.get_running_loop().time() - self._swap_started
            loading = max(1e-3, self.swap_s - elapsed)
        hardware = self._costs[device].hardware
        return ModelState(
            device=device, host=tuple(m for m in self.by_model if m != device),
            loading_s=loading, costs=dict(self._costs),
            weight_bytes={m: c.model.weight_bytes for m, c in self._costs.items()},
            host_link_bandwidth=hardware.host_link_bandwidth,
            disk_bandwidth=hardware.disk_bandwidth, device_memory_bytes=0,
            host_memory_bytes=0, block_size=BLOCK_SIZE)

    def warm_model(self, model: str) -> bool:
        return False  # the sleeping servers hold their weights in host memory already

    # ---- the Instance seam -----------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.awake.alive

    def submit(self, req: Request) -> None:
        self.num_received += 1
        if self.target is None and req.model == self.model:
            self.awake.submit(req)
        else:
            self.parked.append(req)

    def abort(self, request_id: str) -> None:
        self.parked = [r for r in self.parked if r.request_id != request_id]
        for upstream in self.upstreams:
            upstream.abort(request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        wanted = set(request_ids)
        back = [r for r in self.parked if r.request_id in wanted]
        self.parked = [r for r in self.parked if r.request_id not in wanted]
        if back:
            asyncio.get_running_loop().call_soon(self._hand_back, self, back)
        self.awake.withdraw(request_ids)

    def load(self) -> LoadReport:
        report = self.awake.load()
        if not self.parked:
            return LoadReport(stats=report.stats, num_received=self.num_received,
                              drain_time=report.drain_time)
        stats = dataclasses.replace(report.stats,
                                    num_waiting=report.stats.num_waiting + len(self.parked))
        return LoadReport(stats=stats, num_received=self.num_received,
                          drain_time=max(report.drain_time, self.swap_s))

    def swap_model(self, model: str) -> None:
        if model not in self.by_model:
            raise ValueError(f"device {self.name} has no server for model {model!r}")
        if model == (self.target or self.model):
            return
        if self._task is not None and not self._task.done():
            log.info("device %s: swap to %s asked while swapping to %s; after it",
                     self.name, model, self.target)
        self.target = model
        self._swap_started = asyncio.get_running_loop().time()
        previous = self._task
        self._task = asyncio.get_running_loop().create_task(self._swap(model, previous),
                                                            name=f"swap-{self.name}")

    async def settle(self) -> None:
        """At start: every server but the awake one asleep (FleetError-free: a failure
        is logged, the swap logic puts them to sleep later anyway)."""
        for upstream in self.upstreams:
            if upstream is not self.awake and not upstream.info.sleeping:
                try:
                    await self._call(upstream, f"/sleep?level={SLEEP_LEVEL}")
                except Exception as exc:
                    log.error("device %s: cannot put %s to sleep: %s", self.name,
                              upstream.url, exc)
        if self.awake.info.sleeping:
            await self._call(self.awake, "/wake_up")

    # ---- the swap ------------------------------------------------------------------------
    async def _swap(self, model: str, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        outgoing, incoming = self.awake, self.by_model[model]
        started = asyncio.get_running_loop().time()
        try:
            while outgoing.num_in_flight:  # the running requests finish first
                await asyncio.sleep(DRAIN_POLL_S)
            if outgoing is not incoming:
                await self._call(outgoing, f"/sleep?level={SLEEP_LEVEL}")
                await self._call(incoming, "/wake_up")
        except Exception as exc:
            log.error("device %s: swap %s -> %s failed (%s); %d parked request(s) go "
                      "back to the queue", self.name, outgoing.models[0], model, exc,
                      len(self.parked))
            self.target = None
            back, self.parked = self.parked, []
            self._hand_back(self, back)
            return
        self.awake = incoming
        self.swap_s = asyncio.get_running_loop().time() - started
        self.num_swaps += 1
        if self.target == model:
            self.target = None
        log.info("device %s: %s swapped in (%.3f s)", self.name, model, self.swap_s)
        self._release_parked()
        self._on_swapped(self)

    async def _call(self, upstream: UpstreamInstance, path: str) -> None:
        status = await self._post(upstream.url, path)
        if status != 200:
            raise RuntimeError(f"{upstream.url}{path} answered {status}")

    def _release_parked(self) -> None:
        """Send the parked requests of the awake model; the others wait for theirs
        (a swap to it is pending) or go back to the queue."""
        if self.target is not None:
            return  # another swap follows: they wait for it
        keep: list[Request] = []
        back: list[Request] = []
        for req in self.parked:
            (keep if req.model == self.model else back).append(req)
        self.parked = []
        for req in keep:
            self.awake.submit(req)
        if back:
            self._hand_back(self, back)
