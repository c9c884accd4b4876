"""The fleet: andante's cluster layer in front of upstream OpenAI-compatible servers.

Design note (DESIGN.md §4; QLM §3 global queue; Ascendra §4-5 pools and offload). Every
request becomes a `Request` for the same `Controller` and routers that drive in-process
and Ray instances (one controller per model: `members`), and an upstream is an
`UpstreamInstance`. Forwarding runs on the event loop, one task per attempt:
- requests go through a small pass-through HTTP/1.1 client (`http1`: a keep-alive pool
  per upstream, no per-chunk parsing) and streamed answers are passed through as they
  arrive (usage chunks included: the body goes as the client sent it); a client that
  goes away aborts the request, which cancels the task and closes the upstream
  connection (vLLM and andante abort a request whose connection closes); httpx serves
  only the probes (/metrics), where latency does not matter;
- a 429 or 5xx answer, or a connection that fails before a byte reached the client, is
  retried elsewhere (the router's `place_handoff`: another upstream), then, once every
  upstream was tried, after a growing back-off, until the request's deadline (its SLO
  deadline, else `retry_window_s`); then the client gets the last refusal;
- every upstream's /metrics is polled each `poll_interval` seconds (its load); an
  upstream whose probe fails `down_after` times in a row (each bounded by
  `probe_timeout`), or refuses connections, is marked down: the controller re-queues its
  requests that streamed nothing and the others end with an error event; it is probed on
  and comes back when it answers;
- with a pool router (ascendra) an LP upstream's request that has streamed nothing after
  `offload_at` of its TTFT target is withdrawn and handed back: Ascendra's offload of a
  request about to miss its TTFT (§5.3), decided here since an upstream cannot hand a
  request back itself;
- requests that wait in a controller's queue (every upstream of their model down, or a
  queue-holding router) past their deadline end with a 503;
- upstreams that share a device (a fleet file's `device`; each in sleep mode) are one
  instance of one controller over their models, whose qlm router swaps them through
  their `/sleep` and `/wake_up` (andante.runtime.upstream.device); its awake server
  down takes the device out of routing until it is back, a sleeping one down takes out
  only its model (the awake model is routed on); a server that returns is put back in
  the device's choice (asleep, or awake) before it is routed to;
- a request the router placed where its model cannot be served now (QLM refuses it onto
  an instance when every server of its model is down; or its server there fell between
  the route and the submit) is placed again at once if another upstream serves its model
  now (at most `MAX_REPLACES` times in a row), else *held* here: it goes back to its
  controller when an upstream comes back or at a poll that finds its model served, and
  ends with a 503 at its deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from andante.cluster.controller import Controller
from andante.cluster.registry import make_router, router_entry
from andante.core.clock import Clock, MonotonicClock
from andante.core.request import Request, SyntheticTokens
from andante.core.sampling import DEFAULT_TTFT_TARGET, SamplingParams
from andante.runtime.upstream.call import Call, Chunk, End, Failure, Full
from andante.runtime.upstream.device import SharedDevice
from andante.runtime.upstream.discovery import FleetError, UpstreamInfo
from andante.runtime.upstream.http1 import ConnectFailed, UpstreamError, UpstreamPool
from andante.runtime.upstream.instance import UpstreamInstance
from andante.runtime.upstream.members import Member, ModelGroup, devices_of, linked_models
from andante.runtime.upstream.metrics import parse_load

log = logging.getLogger("andante.fleet")
HP = "hp"
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away
OFFLOAD_CHECK_S = 0.02
SWAP_CALL_TIMEOUT_S = 120.0  # a device's /sleep or /wake_up (vLLM moves weights)
MAX_REPLACES = 3  # placements in a row where the model cannot be served, then held


@dataclass(frozen=True, slots=True)
class FleetOptions:
    router: str = "least-loaded"
    router_options: dict[str, Any] = field(default_factory=dict)
    poll_interval: float = 0.5
    probe_timeout: float = 2.0
    down_after: int = 2
    connect_timeout: float = 2.0
    retry_window_s: float = 60.0
    max_attempts: int = 8
    offload_at: float = 0.5  # ascendra: share of the TTFT target before an offload
    default_max_tokens: int = 256

    def __post_init__(self) -> None:
        for name in ("poll_interval", "probe_timeout", "connect_timeout", "retry_window_s",
                     "offload_at"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.down_after < 1 or self.max_attempts < 1:
            raise ValueError(f"down_after and max_attempts must be >= 1, got "
                             f"{self.down_after}, {self.max_attempts}")


class Fleet:
    def __init__(self, infos: Sequence[UpstreamInfo], options: FleetOptions,
                 clock: Clock | None = None) -> None:
        self.options = options
        self.clock = clock or MonotonicClock()
        self.upstreams = [UpstreamInstance(i, info, self.clock, self._forward, self._hand_back)
                          for i, info in enumerate(infos)]
        self.groups = self._build_groups()
        self.calls: dict[str, Call] = {}
        self.num_retries = 0
        self.num_offloads = 0
        self.num_failed = 0
        self.held: list[Request] = []  # placed where their model's servers are down
        self._restoring: set[int] = set()  # upstreams being put back in their state
        self._probe_client: httpx.AsyncClient | None = None
        self._pools: list[UpstreamPool] = []
        self._poller: asyncio.Task[None] | None = None
        self._offloader: asyncio.Task[None] | None = None

    def _build_groups(self) -> dict[str, ModelGroup]:
        """One controller per model, or per set of models linked by shared devices
        (`device`: their upstreams' models swap there, QLM decides when)."""
        groups: dict[str, ModelGroup] = {}
        if any(u.info.spec.device for u in self.upstreams) \
                and not router_entry(self.options.router).swaps_models:
            raise FleetError(f"upstreams sharing a device swap models, which router "
                             f"{self.options.router!r} does not decide: use --router qlm")
        for models in linked_models(self.upstreams):
            members: list[Member | SharedDevice] = []
            index_of: dict[int, int] = {}
            for device, ups in devices_of(self.upstreams, models).items():
                index_of.update((u.index, len(members)) for u in ups)
                awake = next((i for i, u in enumerate(ups) if not u.info.sleeping), 0)
                members.append(SharedDevice(len(members), device, ups, awake,
                                            self._post_to, self._swapped, self._parked_back,
                                            self._hold, self._cut_for_swap, self.clock,
                                            self._queued_for))
            for model in models:
                for u in self.upstreams:
                    if model in u.models and not u.info.spec.device:
                        if u.index in index_of:
                            raise FleetError(f"upstream {u.url} serves several models of "
                                             "a device's set: give each its own server")
                        index_of[u.index] = len(members)
                        members.append(Member(len(members), u, model, self._hold))
            router = make_router(self.options.router, dict(self.options.router_options))
            group = ModelGroup(models[0], Controller(members, router), index_of)
            groups.update((m, group) for m in models)
        return groups

    @property
    def devices(self) -> list[SharedDevice]:
        return [s.instance for g in self.unique_groups for s in g.controller.slots
                if isinstance(s.instance, SharedDevice)]

    @property
    def unique_groups(self) -> list[ModelGroup]:
        return list({id(g): g for g in self.groups.values()}.values())

    @property
    def models(self) -> list[str]:
        return list(self.groups)

    @property
    def offloads(self) -> bool:
        return router_entry(self.options.router).pool_plan is not None

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        tls = ssl.create_default_context()  # one for all (loading it costs ~0.1 s)
        self._pools = [UpstreamPool(u.url, self.options.connect_timeout, tls)
                       for u in self.upstreams]
        self._probe_client = httpx.AsyncClient(
            verify=tls, timeout=httpx.Timeout(None, connect=self.options.connect_timeout))
        await asyncio.gather(*(d.settle() for d in self.devices))
        await self._poll_once()
        self._poller = asyncio.create_task(self._poll_loop(), name="fleet-poller")
        if self.offloads:
            self._offloader = asyncio.create_task(self._offload_loop(), name="fleet-offload")

    async def stop(self) -> None:
        for task in (self._poller, self._offloader):
            if task is not None:
                task.cancel()
        for upstream in self.upstreams:
            upstream.cancel_all()
        for call in list(self.calls.values()):
            self._fail(call, 503, "the server is shutting down", "shutting_down")
        for pool in self._pools:
            pool.close()
        if self._probe_client is not None:
            await self._probe_client.aclose()

    # ---- requests in ----------------------------------------------------------------
    def submit(self, call: Call, prompt_tokens: int, max_tokens: int | None,
               priority: int = 0) -> None:
        """Place `call` (its model is served: the edge checked)."""
        self.calls[call.request_id] = call
        sampling = SamplingParams(max_tokens=max_tokens or self.options.default_max_tokens)
        req = Request(call.request_id, SyntheticTokens(max(1, prompt_tokens)), sampling,
                      call.arrival, priority=priority, model=call.model, slo=call.slo)
        self.groups[call.model].controller.submit(req)

    def abort(self, request_id: str) -> None:
        """The client went away: stop serving it wherever it is."""
        call = self.calls.pop(request_id, None)
        if call is None:
            return
        call.push(Failure(CLIENT_CLOSED, "the client closed the connection", "aborted"))
        self.groups[call.model].controller.abort(request_id)

    @property
    def alive(self) -> bool:
        return any(u.alive for u in self.upstreams)

    @property
    def num_not_started(self) -> int:
        """Requests known to wait for their first token: queued here, or streaming
        without a first byte yet (a non-streamed answer's start is not seen)."""
        queued = {req.request_id for g in self.unique_groups for req in g.controller.queue}
        queued.update(req.request_id for req in self.held)
        return len(queued) + sum(1 for c in self.calls.values()
                                 if c.stream and not c.started and c.request_id not in queued)

    @property
    def num_queued(self) -> int:
        """Requests waiting for an upstream: in a controller's queue, or held."""
        return sum(len(g.controller.queue) for g in self.unique_groups) + len(self.held)

    # ---- one attempt on one upstream ------------------------------------------------------
    async def _forward(self, upstream: UpstreamInstance, req: Request) -> None:
        call = self.calls.get(req.request_id)
        if call is None or call.finished:
            return
        call.attempts += 1
        sent = self.clock.now()
        payload = call.payload_for(upstream.kind)
        attempt = asyncio.current_task()
        relay = None
        if call.stream:
            def relay(data: bytes) -> None:
                self._relay(upstream, call, data, attempt)
        try:
            conn = await self._pools[upstream.index].post(call.path, payload, relay)
            head = conn.head
            assert head is not None
            call.num_replaced = 0  # an upstream of its model answered: placed right
            if head.status == 429 or head.status >= 500:
                answer = Full(head.status, head.content_type, await conn.read())
                self._refused(upstream, call, req, answer)
            elif head.status != 200 or not call.stream:
                answer = Full(head.status, head.content_type, await conn.read())
                self._finish(upstream, call, answer)
            else:
                assert relay is not None
                await conn.stream(relay)
                self._finish(upstream, call, End())
            upstream.observe_service(self.clock.now() - sent)
        except UpstreamError as exc:
            self._broken(upstream, call, req, exc)

    def _relay(self, upstream: UpstreamInstance, call: Call, data: bytes,
               attempt: asyncio.Task[Any] | None) -> None:
        """Body bytes as they arrive (in the connection's callback) to the client, but
        those of an attempt already cancelled (a down upstream's, a withdrawn one's: its
        request may be placed again, and must not be answered twice), which can still
        arrive in the loop iteration of the cancel, before the task closes the
        connection."""
        if attempt is not None and attempt.cancelling():
            return
        if not call.started:
            self._started(upstream, call)
        call.push(Chunk(data))

    def _started(self, upstream: UpstreamInstance, call: Call) -> None:
        """The first byte: the request cannot move any more, and its upstream's load
        changed (a queue-holding router may pull the next one)."""
        call.started = True
        upstream.started.add(call.request_id)
        controller = self.groups[call.model].controller
        if controller.queue:
            controller.dispatch_queue()

    def _finish(self, upstream: UpstreamInstance, call: Call, event: End | Full) -> None:
        self.calls.pop(call.request_id, None)
        call.push(event)
        group = self.groups[call.model]
        group.controller.on_step(group.member_of(upstream), (call.request_id,))

    def _refused(self, upstream: UpstreamInstance, call: Call, req: Request,
                 answer: Full) -> None:
        """A 429 or 5xx: elsewhere within the deadline, else the client gets it."""
        if call.attempts >= self.options.max_attempts or self.clock.now() >= call.deadline:
            log.warning("request %s: upstream %s answered %d, no retry left", call.request_id,
                        upstream.url, answer.status)
            self._finish(upstream, call, answer)
            return
        self._retry(upstream, call, req)

    def _broken(self, upstream: UpstreamInstance, call: Call, req: Request,
                exc: UpstreamError) -> None:
        """The connection failed: re-place the request if it streamed nothing, else end
        it with an error; probe the upstream now."""
        log.warning("upstream %s: %s on request %s", upstream.url, exc, call.request_id)
        asyncio.get_running_loop().create_task(self._probe(upstream, refusal_is_down=True))
        if call.started:
            self._fail_started(upstream, call)
        elif call.attempts >= self.options.max_attempts or self.clock.now() >= call.deadline:
            group = self.groups[call.model]
            group.controller.on_step(group.member_of(upstream), (call.request_id,))
            kind = "ConnectError" if isinstance(exc, ConnectFailed) else "connection lost"
            self._fail(call, 502, f"no upstream could serve the request (last: "
                       f"{upstream.url}: {kind})", "upstream_unavailable")
        else:
            self._retry(upstream, call, req)

    def _retry(self, upstream: UpstreamInstance, call: Call, req: Request) -> None:
        self.num_retries += 1
        group = self.groups[call.model]
        index = group.member_of(upstream)
        num_instances = len(group.controller.slots)  # a shared device is one
        if call.attempts < num_instances:  # another instance, now
            group.controller.on_step(index, handoffs=(req,))
            return
        group.controller.on_finished(call.request_id)  # every one tried: back off
        delay = min(2.0, 0.05 * 2 ** (call.attempts - num_instances))
        asyncio.get_running_loop().call_later(delay, self._resubmit, call, req)

    def _resubmit(self, call: Call, req: Request) -> None:
        if not call.finished and self.calls.get(call.request_id) is call:
            self.groups[call.model].controller.submit(req)

    def _fail_started(self, upstream: UpstreamInstance, call: Call) -> None:
        group = self.groups[call.model]
        group.controller.on_step(group.member_of(upstream), (call.request_id,))
        self._fail(call, 502, f"upstream {upstream.url} failed while streaming this "
                   "request", "upstream_failed")

    def _fail(self, call: Call, status: int, message: str, code: str) -> None:
        self.calls.pop(call.request_id, None)
        if not call.finished:
            self.num_failed += 1
            call.push(Failure(status, message, code))

    async def _post_to(self, url: str, path: str) -> int:
        """A device's sleep and wake calls (latency does not matter: httpx)."""
        assert self._probe_client is not None
        resp = await self._probe_client.post(url + path, timeout=SWAP_CALL_TIMEOUT_S)
        return resp.status_code

    def _swapped(self, device: SharedDevice) -> None:
        """A device serves another model: its queue may move on."""
        for group in self.unique_groups:
            if any(slot.instance is device for slot in group.controller.slots):
                group.controller.dispatch_queue()

    def _parked_back(self, device: SharedDevice, reqs: list[Request]) -> None:
        """Requests a device parked and cannot serve now: back to the global queue."""
        for req in reqs:
            call = self.calls.get(req.request_id)
            if call is None or call.finished:
                continue
            group = self.groups[call.model]
            group.controller.on_finished(call.request_id)
            group.controller.submit(req)

    def _hold(self, req: Request) -> None:
        """`req` was placed where its model cannot be served now: placed again if
        another upstream serves its model now, else it waits here, out of the router's
        way, for an upstream to come back (`_release_held`) or for its deadline
        (`_expire_held`)."""
        call = self.calls.get(req.request_id)
        controller = self.groups[req.model].controller
        controller.on_finished(req.request_id)
        if call is None or call.finished:
            return
        if self._servable(req.model) and call.num_replaced < MAX_REPLACES:
            call.num_replaced += 1
            controller.submit(req)
            return
        log.warning("request %s waits: no upstream serving %r is up", req.request_id,
                    req.model)
        self.held.append(req)

    def _servable(self, model: str) -> bool:
        """An instance of `model`'s controller can serve it now: routed to, with its
        server of `model` up."""
        for slot in self.groups[model].controller.slots:
            instance = slot.instance
            if not slot.alive:
                continue
            if isinstance(instance, SharedDevice) and instance.serves(model):
                return True
            if isinstance(instance, Member) and instance.model == model:
                return True
        return False

    def _queued_for(self, model: str) -> list[Request]:
        """The requests for `model` in its controller's queue."""
        group = self.groups.get(model)
        return [] if group is None else [r for r in group.controller.queue
                                         if r.model == model]

    def _cut_for_swap(self, upstream: UpstreamInstance, request_ids: list[str],
                      model: str) -> None:
        """A device cuts these streams of its outgoing server for a swap: each ends
        with an error event (its client holds part of an answer)."""
        for rid in request_ids:
            call = self.calls.get(rid)
            upstream.abort(rid)
            if call is None:
                continue
            group = self.groups[call.model]
            group.controller.on_step(group.member_of(upstream), (rid,))
            self._fail(call, 503, f"evicted: its server {upstream.url} was put to sleep to "
                       f"serve {model!r} (a swap that could not wait)", "evicted")

    def _release_held(self, only_servable: bool = False) -> None:
        """An upstream came back (or a poll: `only_servable`, those whose model is
        served): the held requests go to their controllers again (those whose model
        is still unserved come back here). Their count of re-placements stays (it is
        reset once an upstream answers them): one misplaced again is held again at
        once, so a request goes round at most once per poll, not `MAX_REPLACES` times."""
        held, self.held = self.held, []
        for req in held:
            call = self.calls.get(req.request_id)
            if call is None or call.finished:
                continue
            if only_servable and not self._servable(call.model):
                self.held.append(req)
                continue
            self.groups[call.model].controller.submit(req)

    def _hand_back(self, index: int, reqs: list[Request]) -> None:
        """Requests an upstream withdrew (offloads): their router places them again."""
        upstream = self.upstreams[index]
        for req in reqs:
            call = self.calls.get(req.request_id)
            if call is None or call.finished:
                continue
            group = self.groups[call.model]
            group.controller.on_step(group.member_of(upstream), handoffs=(req,))

    # ---- health and load ------------------------------------------------------------------
    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_interval)
            try:
                await self._poll_once()
            except Exception:  # never let the poller die silently
                log.exception("fleet poller")

    async def _poll_once(self) -> None:
        await asyncio.gather(*(self._probe(u) for u in self.upstreams))
        now = self.clock.now()
        self._expire_held(now)
        if self.held:
            self._release_held(only_servable=True)
        for group in self.unique_groups:
            self._expire(group, now)
            if group.controller.queue:
                group.controller.dispatch_queue()

    async def _offload_loop(self) -> None:
        while True:
            await asyncio.sleep(OFFLOAD_CHECK_S)
            self._offload(self.clock.now())

    async def _probe(self, upstream: UpstreamInstance, refusal_is_down: bool = False) -> None:
        try:
            assert self._probe_client is not None
            resp = await self._probe_client.get(upstream.url + "/metrics",
                                                timeout=self.options.probe_timeout)
            ok, reason = resp.status_code == 200, f"/metrics answered {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, reason = False, f"{type(exc).__name__} {exc}".strip()
            if refusal_is_down and isinstance(exc, httpx.ConnectError):
                upstream.num_failed_probes = self.options.down_after - 1
        if ok:
            upstream.observe_poll(parse_load(resp.text))
            upstream.num_failed_probes = 0
            if not upstream.up and await self._back_in_device_state(upstream):
                self._recovered(upstream)
            return
        upstream.num_failed_probes += 1
        if upstream.up and upstream.num_failed_probes >= self.options.down_after:
            self._down(upstream, reason)

    def _down(self, upstream: UpstreamInstance, reason: str) -> None:
        upstream.up = False
        started = set(upstream.started)
        upstream.cancel_all()
        requeued = failed = 0
        for group in self._groups_of(upstream):
            index = group.member_of(upstream)
            device = group.controller.slots[index].instance
            if isinstance(device, SharedDevice):
                parked = device.server_down(upstream)
                if upstream is not device.awake:  # the awake server's requests go on
                    requeued += len(parked)
                    group.controller.on_step(index, handoffs=parked)
                    continue
            outcome = group.controller.instance_failed(index, started.__contains__)
            requeued += len(outcome.requeued)
            for rid in outcome.failed:
                call = self.calls.get(rid)
                if call is not None:
                    failed += 1
                    self._fail(call, 502, f"upstream {upstream.url} went down while "
                               "streaming this request", "upstream_failed")
        log.error("upstream %s is down (%s): %d request(s) re-queued, %d failed",
                  upstream.url, reason, requeued, failed)

    async def _back_in_device_state(self, upstream: UpstreamInstance) -> bool:
        """A down upstream answers: a device's server is first put back in the state
        its device chose (one call at a time; False: not yet, it stays down)."""
        device = self._device_of(upstream)
        if device is None:
            return True
        if upstream.index in self._restoring:
            return False
        self._restoring.add(upstream.index)
        try:
            return await device.server_back(upstream) and not upstream.up
        finally:
            self._restoring.discard(upstream.index)

    def _device_of(self, upstream: UpstreamInstance) -> SharedDevice | None:
        return next((d for d in self.devices if upstream in d.upstreams), None)

    def _recovered(self, upstream: UpstreamInstance) -> None:
        upstream.up = True
        log.warning("upstream %s is back", upstream.url)
        for group in self._groups_of(upstream):
            slot = group.controller.slots[group.member_of(upstream)]
            if slot.down and slot.instance.alive:
                group.controller.instance_recovered(slot.index)
            else:  # a device's sleeping server: its model is servable again
                group.controller.dispatch_queue()
        self._release_held()

    def _groups_of(self, upstream: UpstreamInstance) -> Iterator[ModelGroup]:
        return (g for g in self.unique_groups if upstream.index in g.members)

    def _expire(self, group: ModelGroup, now: float) -> None:
        """Requests queued past their deadline end with a 503."""
        for req in list(group.controller.queue):
            call = self.calls.get(req.request_id)
            if call is not None and now >= call.deadline:
                group.controller.abort(req.request_id)
                self._fail_unplaced(call)

    def _expire_held(self, now: float) -> None:
        """Held requests past their deadline end with a 503; gone clients' leave."""
        kept = []
        for req in self.held:
            call = self.calls.get(req.request_id)
            if call is None or call.finished:
                continue
            if now >= call.deadline:
                self._fail_unplaced(call)
            else:
                kept.append(req)
        self.held = kept

    def _fail_unplaced(self, call: Call) -> None:
        self._fail(call, 503, f"no upstream serving {call.model!r} could take the request "
                   "before its deadline", "upstream_unavailable")

    def _offload(self, now: float) -> None:
        """Ascendra §5.3 on upstreams: withdraw LP requests about to miss their TTFT."""
        for upstream in self.upstreams:
            if upstream.role == HP or not upstream.up:
                continue
            late = [rid for rid, req in upstream.requests.items()
                    if rid not in upstream.started and now - req.arrival_time
                    >= self.options.offload_at * (req.slo.ttft or DEFAULT_TTFT_TARGET)
                    and not self._offloaded(rid)]
            if late:
                self.num_offloads += len(late)
                upstream.withdraw(late)

    def _offloaded(self, rid: str) -> bool:
        """Offload a request once: it stays where the HP pool put it."""
        call = self.calls.get(rid)
        return call is None or call.attempts > 1

    # ---- figures ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "router": self.options.router,
            "upstreams": [_upstream_stats(u) for u in self.upstreams],
            "queued": self.num_queued,
            "in_flight": len(self.calls),
            "retries": self.num_retries,
            "offloads": self.num_offloads,
            "failed": self.num_failed,
            "requeued": sum(g.controller.num_requeued for g in self.unique_groups),
        }


def _upstream_stats(u: UpstreamInstance) -> dict[str, Any]:
    stats = u.stats()
    return {"url": u.url, "kind": u.kind, "role": u.role, "models": list(u.models),
            "alive": u.alive, "in_flight": u.num_in_flight, "running": stats.num_running,
            "waiting": stats.num_waiting, "kv_usage": stats.kv_usage,
            "service_s": u.service_s if math.isfinite(u.service_s) else None}
