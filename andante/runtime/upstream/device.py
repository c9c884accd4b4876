"""Upstreams that share one device: one cluster instance whose model QLM swaps.

Design note (QLM §5 LSO 5, model swapping; vLLM's dev-mode sleep). Servers started on
one device, each with its own model (vLLM with `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`, andante with `--dev-mode`), take turns: one is awake, the
others sleep at level 1 (weights held in host memory, KV cache released). To the
controller the device is one instance serving all their models (`MultiModel`): the
awake server's model is on the device, the sleeping ones' are warm in host memory. The
swap's steps are the cluster layer's `ModelSwitcher` (andante.cluster.qlm.swap: park
the requests for another model, swap when asked or when the parked head needs it,
release the parked ones in order), driven here on the event loop; this instance is its
`SwapSite`. Before the switcher's swap, the device is drained (the awake server's
requests in flight finish: its flush finds none) and the servers are switched: the
awake one gets `POST /sleep?level=1`, the incoming one `POST /wake_up`, whose measured
time is the install's. Requests for a sleeping model wait (in the global queue, or
parked here) and never fail for it; a switch that fails hands the parked requests back
to the controller. The load the router sees is the awake server's, the parked requests
counted as waiting.

Faults. The device routes while its awake server is up (`alive`). A sleeping server that
goes down takes only its own model out: the model leaves the device's `model_state` (the
router sees it nowhere here, so it re-queues its requests to another upstream that serves
it, or the fleet holds them against their deadline: `hold`), no swap goes to it, and the
awake model's requests are routed as before. Requests parked here when a server goes down
leave for the queue at once (`server_down`: never both re-queued and released here); a
switch under way stops before it puts the awake server to sleep or at the next drain poll.
The awake server down takes the whole device out until it is back. A server that returns
(after a restart it is awake, whatever it was before: two awake servers on one GPU run out
of memory) is put back in the device's current choice before it is routed to
(`server_back`: the awake one woken, any other put to sleep).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from andante.cluster.instance import BASIC_CAPABILITIES, SWAP_MODEL, LaterOperations, ModelState
from andante.cluster.load import LoadReport
from andante.cluster.qlm.swap import ModelSwitcher
from andante.cluster.qlm.tiers import ModelTiers
from andante.core.request import Request
from andante.engine.engine import Engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.runtime.upstream.instance import UpstreamInstance

log = logging.getLogger("andante.fleet")
BLOCK_SIZE = 16
SLEEP_LEVEL = 1
DRAIN_POLL_S = 0.01
INITIAL_SWAP_S = 1.0  # the estimate until a swap has been measured
FAILED_SWAP_BACKOFF_S = 0.5  # parked requests return to the queue this late after a failed swap

# POST a path (with query) to an upstream's URL; returns the status (raises on failure)
PostFn = Callable[[str, str], Awaitable[int]]


class _Drained:
    """The switcher's view of the device's engine at a swap: the device is drained
    first, so there is nothing to flush and no work."""

    has_work = False

    class scheduler:  # noqa: N801 (the engine's attribute)
        requests: dict[str, Request] = {}


class SharedDevice(LaterOperations):
    capabilities = BASIC_CAPABILITIES | {SWAP_MODEL}

    def __init__(self, index: int, name: str, upstreams: Sequence[UpstreamInstance],
                 awake: int, post: PostFn, on_swapped: Callable[[SharedDevice], None],
                 hand_back: Callable[[SharedDevice, list[Request]], None],
                 hold: Callable[[Request], None] | None = None) -> None:
        self.index = index
        self.name = name
        self.upstreams = list(upstreams)
        self.by_model = {u.models[0]: u for u in self.upstreams}
        self.awake = self.upstreams[awake]
        self.role = self.awake.role
        self._post = post
        self._on_swapped = on_swapped
        self._hand_back = hand_back
        self._hold = hold or (lambda req: hand_back(self, [req]))
        self._costs = {u.models[0]: CostModel(get_model(u.info.spec.cost_model),
                                              get_hardware(u.info.spec.hardware))
                       for u in self.upstreams}
        tiers = ModelTiers({m: c.model.weight_bytes for m, c in self._costs.items()},
                           self.awake.models[0],
                           host=[m for m in self.by_model if m != self.awake.models[0]])
        self.switcher = ModelSwitcher(tiers, self)
        self.target: str | None = None  # the model being switched in
        self.num_received = 0  # every request handed here (the controller's in-transit)
        self.swap_s = INITIAL_SWAP_S
        self._switch_started = 0.0
        self._driver: asyncio.Task[None] | None = None

    @property
    def model(self) -> str:
        return self.switcher.tiers.device

    @property
    def num_swaps(self) -> int:
        return len(self.switcher.swaps)

    @property
    def parked(self) -> list[Request]:
        return list(self.switcher.parked)

    # ---- MultiModel ---------------------------------------------------------------------
    def model_state(self) -> ModelState:
        device = self.target or self.model
        loading = 0.0
        if self.target is not None:
            elapsed = asyncio.get_running_loop().time() - self._switch_started
            loading = max(1e-3, self.swap_s - elapsed)
        hardware = self._costs[device].hardware
        held = [m for m in self.by_model if m == device or self.serves(m)]
        return ModelState(
            device=device, host=tuple(m for m in held if m != device),
            loading_s=loading, costs={m: self._costs[m] for m in held},
            weight_bytes={m: self._costs[m].model.weight_bytes for m in held},
            host_link_bandwidth=hardware.host_link_bandwidth,
            disk_bandwidth=hardware.disk_bandwidth, device_memory_bytes=0,
            host_memory_bytes=0, block_size=BLOCK_SIZE)

    def warm_model(self, model: str) -> bool:
        return False  # the sleeping servers hold their weights in host memory already

    # ---- the Instance seam -----------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """The awake server is up (a sleeping one down takes out only its model)."""
        return self.awake.alive

    def serves(self, model: str) -> bool:
        """`model`'s server here is up (so the device can serve or swap to it)."""
        upstream = self.by_model.get(model)
        return upstream is not None and upstream.alive

    def server_down(self, upstream: UpstreamInstance) -> list[Request]:
        """`upstream`, one of this device's servers, is down: the parked requests
        (none has a token) leave this device, for the caller to place again; a switch
        under way gives up at its next step (`_switch_servers`)."""
        parked = self.switcher.unpark([r.request_id for r in self.switcher.parked])
        log.error("device %s: server %s is down (%s); %d parked request(s) go back to the "
                  "queue", self.name, upstream.url,
                  "awake" if upstream is self.awake else "asleep", len(parked))
        return parked

    async def server_back(self, upstream: UpstreamInstance) -> bool:
        """`upstream`, down until now, answers again: put it in the state this device
        chose for it before it is routed to (a server restarted after a crash comes back
        awake: asleep unless it is the awake one). False: it did not comply (it stays
        down; the next probe tries again)."""
        path = "/wake_up" if upstream is self.awake else f"/sleep?level={SLEEP_LEVEL}"
        try:
            await self._call(upstream, path)
        except Exception as exc:
            log.error("device %s: server %s is back but %s failed (%s); it stays out",
                      self.name, upstream.url, path, exc)
            return False
        log.warning("device %s: server %s is back, %s", self.name, upstream.url,
                    "awake" if upstream is self.awake else "put to sleep")
        return True

    def submit(self, req: Request) -> None:
        self.num_received += 1
        if req.model and not self.serves(req.model):  # its server went down meanwhile
            asyncio.get_running_loop().call_soon(self._hold, req)
            return
        if self.target is not None or self.switcher.must_park(req):
            self.switcher.park(req)
            self._drive()  # the parked head may need a swap
        else:
            self.awake.submit(req)

    def abort(self, request_id: str) -> None:
        self.switcher.unpark([request_id])
        for upstream in self.upstreams:
            upstream.abort(request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        back = self.switcher.unpark(request_ids)
        if back:
            asyncio.get_running_loop().call_soon(self._hand_back, self, back)
        self.awake.withdraw(request_ids)

    def load(self) -> LoadReport:
        report = self.awake.load()
        parked = len(self.switcher.parked)
        if not parked:
            return LoadReport(stats=report.stats, num_received=self.num_received,
                              drain_time=report.drain_time)
        stats = dataclasses.replace(report.stats,
                                    num_waiting=report.stats.num_waiting + parked)
        return LoadReport(stats=stats, num_received=self.num_received,
                          drain_time=max(report.drain_time, self.swap_s))

    def swap_model(self, model: str) -> None:
        self.switcher.tiers.check(model)  # ValueError: not one of this device's models
        if not self.serves(model):
            log.info("device %s: no swap to %s, whose server is down", self.name, model)
            return
        self.switcher.ask(model)
        self._drive()

    # ---- SwapSite (the switcher's side) ------------------------------------------------------
    @property
    def engine(self) -> Engine:
        return cast(Engine, _Drained)

    def install(self, model: str, source: str) -> float:
        return self.swap_s  # the servers were switched (measured) just before

    def admit(self, req: Request) -> None:
        self.awake.submit(req)

    def hand_back(self, reqs: list[Request]) -> None:
        self._hand_back(self, reqs)

    # ---- driving the switcher on the event loop -------------------------------------------------
    async def settle(self) -> None:
        """At start: every server but the awake one asleep (a failure is logged: the
        fleet serves on, the next swap tries again)."""
        try:
            for upstream in self.upstreams:
                if upstream is not self.awake and not upstream.info.sleeping:
                    await self._call(upstream, f"/sleep?level={SLEEP_LEVEL}")
            if self.awake.info.sleeping:
                await self._call(self.awake, "/wake_up")
        except Exception as exc:
            log.error("device %s: cannot settle its servers at start: %s", self.name, exc)

    def _drive(self) -> None:
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(
                self._switch_while_due(), name=f"device-{self.name}")

    async def _switch_while_due(self) -> None:
        while (model := self.switcher.next_model) is not None:
            self.target = model
            self._switch_started = asyncio.get_running_loop().time()
            if not await self._switch_servers(model):
                self.target = None
                self.switcher.pending = None
                back = self.switcher.unpark([r.request_id for r in self.switcher.parked])
                # later, from outside this driver: the router may place them here again,
                # and a request parked while this driver runs would find no driver
                asyncio.get_running_loop().call_later(
                    FAILED_SWAP_BACKOFF_S, self._hand_back, self, back)
                return
            self.target = None
            if self.switcher.pending == model:
                self.switcher.pending = None  # another asked for meanwhile stays asked
            self.switcher.swap(model, asyncio.get_running_loop().time())
            log.info("device %s: %s swapped in (%.3f s)", self.name, model, self.swap_s)
            self._on_swapped(self)
        self.switcher.release_parked()

    async def _switch_servers(self, model: str) -> bool:
        """Drain the awake server, put it to sleep, wake `model`'s (False: failed)."""
        outgoing, incoming = self.awake, self.by_model[model]
        started = asyncio.get_running_loop().time()
        try:
            while outgoing.num_in_flight:
                _check_up(outgoing, incoming)
                await asyncio.sleep(DRAIN_POLL_S)
            _check_up(outgoing, incoming)  # never put the awake one to sleep for nothing
            await self._call(outgoing, f"/sleep?level={SLEEP_LEVEL}")
        except Exception as exc:
            self._log_failed_swap(model, exc)
            return False
        try:
            await self._call(incoming, "/wake_up")
        except Exception as exc:
            self._log_failed_swap(model, exc)
            await self._wake_again(outgoing)
            return False
        self.awake = incoming
        self.swap_s = asyncio.get_running_loop().time() - started
        return True

    def _log_failed_swap(self, model: str, exc: Exception) -> None:
        log.error("device %s: swap %s -> %s failed (%s); %d parked request(s) go back to "
                  "the queue", self.name, self.awake.models[0], model, exc,
                  len(self.switcher.parked))

    async def _wake_again(self, outgoing: UpstreamInstance) -> None:
        """The incoming server did not wake: the outgoing one, already asleep, serves
        again (else the device has no awake server; its requests then fail over as an
        unanswering upstream's do)."""
        try:
            await self._call(outgoing, "/wake_up")
        except Exception as exc:
            log.error("device %s: %s does not wake up again either (%s)", self.name,
                      outgoing.url, exc)

    async def _call(self, upstream: UpstreamInstance, path: str) -> None:
        status = await self._post(upstream.url, path)
        if status != 200:
            raise RuntimeError(f"{upstream.url}{path} answered {status}")


def _check_up(*servers: UpstreamInstance) -> None:
    """A switch goes on only while both its servers are up."""
    for server in servers:
        if not server.alive:
            raise RuntimeError(f"{server.url} is down")
