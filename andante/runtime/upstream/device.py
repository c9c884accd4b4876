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
`SwapSite`. Before the switcher's swap, the device is drained (its flush then finds
none) and the servers are switched: the awake one gets `POST /sleep?level=1`, the
incoming one `POST /wake_up`, whose measured time is the swap's (`swap_s`).

Requests for a sleeping model wait (in the global queue, or parked here) and never fail
for it; a switch that fails hands the parked requests back to the controller. The load
the router sees is the awake server's, the parked requests counted as waiting.

The drain: wait or evict (QLM §5, Fig. 7: a model swap flushes the running batch, as
request eviction does; the agent evicts only for a head group that would miss its SLO
otherwise). On an upstream the two kinds of request in flight differ:
- a request that has streamed nothing is evicted at once (withdrawn, placed again by the
  controller: it loses only its upstream's prefill, as QLM's eviction loses its KV);
- a stream under way cannot move: the client holds part of an answer that no other
  server resumes bit for bit, so cutting it loses the whole request (it ends with an
  error event), not its KV. The device waits for the streams to finish, and cuts them
  only where QLM's rule says waiting is worse, counted in requests: when waiting one poll
  longer would make a parked request miss a deadline it can still meet by a swap now
  (its deadline less `swap_s` has come), and the requests waiting for the incoming model
  (parked here, or in the global queue: QLM pulls into a swapping instance only what its
  free slots take) that would still meet theirs outnumber the streams to cut
  (`cut_pays`). Requests without a deadline are never at risk. The wait is bounded:
  after `MAX_DRAIN_S` the streams are cut whatever the count (an andante upstream's
  /sleep itself refuses a server busy that long).

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
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from andante.cluster.instance import BASIC_CAPABILITIES, SWAP_MODEL, LaterOperations, ModelState
from andante.cluster.load import LoadReport
from andante.cluster.qlm.swap import ModelSwitcher
from andante.cluster.qlm.tiers import ModelTiers
from andante.core.clock import Clock, MonotonicClock
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
MAX_DRAIN_S = 30.0  # a swap's wait for the streams under way, at most (then they are cut)

# POST a path (with query) to an upstream's URL; returns the status (raises on failure)
PostFn = Callable[[str, str], Awaitable[int]]
# end these streams of an upstream with an error event: evicted for a swap to a model
CutFn = Callable[[UpstreamInstance, list[str], str], None]


def deadline_of(req: Request) -> float:
    """The clock time by which `req` should be complete (its SLO), else never."""
    budget = req.slo.deadline
    return math.inf if budget is None else req.arrival_time + budget


def cut_pays(parked: Sequence[Request], num_streams: int, now: float, swap_s: float) -> bool:
    """Cut the streams under way now rather than wait on (the module note's rule)?"""
    savable = [d for d in map(deadline_of, parked) if d >= now + swap_s]
    if not savable or min(savable) - swap_s > now + DRAIN_POLL_S:
        return False  # nothing parked is about to become late by waiting
    return len(savable) > num_streams


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
                 hold: Callable[[Request], None] | None = None, cut: CutFn | None = None,
                 clock: Clock | None = None,
                 queued: Callable[[str], Sequence[Request]] | None = None) -> None:
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
        self._cut = cut or _abort_streams
        self._clock = clock or MonotonicClock()
        self._queued = queued or (lambda model: ())  # the global queue's, for a model
        self.num_evicted = 0  # requests withdrawn from the outgoing server at swaps
        self.num_cut = 0  # streams cut by swaps
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
        try:
            await self._drain(outgoing, incoming, model)
            started = asyncio.get_running_loop().time()
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

    async def _drain(self, outgoing: UpstreamInstance, incoming: UpstreamInstance,
                     model: str) -> None:
        """The outgoing server's requests leave: the ones without a byte at once, the
        streams when they end or are cut (the module note's rule). Raises when either
        server goes down meanwhile."""
        unstarted = [rid for rid in outgoing.requests if rid not in outgoing.started]
        if unstarted:
            self.num_evicted += len(unstarted)
            log.info("device %s: %d request(s) without a token leave %s for the swap to "
                     "%s", self.name, len(unstarted), outgoing.url, model)
            outgoing.withdraw(unstarted)
        give_up = self._clock.now() + MAX_DRAIN_S
        cut = False
        while outgoing.num_in_flight:
            _check_up(outgoing, incoming)
            streams = sorted(outgoing.started)
            now = self._clock.now()
            if not cut and streams and (now >= give_up or cut_pays(
                    self._waiting_for(model), len(streams), now, self.swap_s)):
                cut = True
                self.num_cut += len(streams)
                log.warning("device %s: %d stream(s) on %s cut for the swap to %s (%s)",
                            self.name, len(streams), outgoing.url, model,
                            "drain bound" if now >= give_up else "parked deadlines")
                self._cut(outgoing, streams, model)
            await asyncio.sleep(DRAIN_POLL_S)
        _check_up(outgoing, incoming)  # never put the awake one to sleep for nothing

    def _waiting_for(self, model: str) -> list[Request]:
        return [r for r in self.switcher.parked if r.model == model] + [
            r for r in self._queued(model) if r.model == model]

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


def _abort_streams(upstream: UpstreamInstance, request_ids: list[str], model: str) -> None:
    for rid in request_ids:
        upstream.abort(rid)


def _check_up(*servers: UpstreamInstance) -> None:
    """A switch goes on only while both its servers are up."""
    for server in servers:
        if not server.alive:
            raise RuntimeError(f"{server.url} is down")
