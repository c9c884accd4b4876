"""The fleet server: `andante serve --upstream URL ...` (andante.runtime.upstream).

The same OpenAI-compatible edge as the engine server (API key, body limits, OpenAI-style
errors), in front of upstream servers instead of engines: /v1/models lists every model
the fleet serves, /v1/completions and /v1/chat/completions are routed by the cluster
layer and proxied (streams pass through as they arrive; andante.server.fleet_proxy
serves these two), /metrics exports the fleet's load under vLLM's names (so a fleet can
be another fleet's upstream) and /api/stats each upstream's figures. A request for a
model no upstream serves gets a 404 naming the served ones; the SLO comes as andante's
`slo` object or as `vllm_xargs` flat keys.

`create_fleet_app` returns a `FleetApp`: the edge guard (API key, content type, body
limits) and the proxied routes in front of the FastAPI routes, so that every request
passes the guard however the app is served (uvicorn, a test client, another ASGI server).
`andante fleet`'s serve path (andante.server.fleet_launch) freezes the start-up heap
before serving (andante.runtime.gc_heap: a full collection of it took 75 ms of the
front's one event loop, once per ~1,000 requests); an app served in-process (tests,
benchmarks) leaves its host's heap alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from andante.runtime.upstream.discovery import UpstreamInfo, UpstreamSpec
from andante.runtime.upstream.fleet import Fleet, FleetOptions
from andante.server.batches.routes import install_batch_routes
from andante.server.config import BatchOptions, HTTPLimits
from andante.server.errors import install_error_handlers
from andante.server.fleet_batches import create_fleet_batch_service
from andante.server.fleet_proxy import FleetProxy
from andante.server.guard import EdgeGuard
from andante.server.metrics import CONTENT_TYPE


@dataclass(frozen=True, slots=True)
class FleetServeOptions:
    upstreams: tuple[UpstreamSpec, ...]
    fleet: FleetOptions = field(default_factory=FleetOptions)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    log_level: str = "info"
    limits: HTTPLimits = field(default_factory=HTTPLimits)
    discovery_timeout: float = 5.0
    batch: BatchOptions = field(default_factory=BatchOptions)


class FleetApp:
    """The fleet server's ASGI app: `front` (the edge guard, then the proxied routes of
    andante.server.fleet_proxy) in front of `api` (FastAPI: the other routes, and
    the lifespan that starts and stops `fleet`)."""

    def __init__(self, front: ASGIApp, api: FastAPI, fleet: Fleet) -> None:
        self.front = front
        self.api = api
        self.fleet = fleet

    @property
    def state(self) -> State:
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.front(scope, receive, send)


def create_fleet_app(options: FleetServeOptions, infos: list[UpstreamInfo]) -> FleetApp:
    fleet = Fleet(infos, options.fleet)
    batches = create_fleet_batch_service(fleet, options.batch)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await fleet.start()
        batches.start()  # resumes the store's unfinished batches
        try:
            yield
        finally:
            await batches.stop()
            await fleet.stop()

    app = FastAPI(title="andante fleet", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.fleet = fleet
    app.state.batches = batches
    keys = {options.api_key.encode("utf-8"): None} if options.api_key else {}
    # the edge guard, then the proxied routes (fleet_proxy), in front of FastAPI's own
    # stack (its error, telemetry and body-limit middleware would cost every proxied
    # request and every chunk sent; the other routes go through it)
    front = EdgeGuard(FleetProxy(app, fleet, options.limits, options.fleet), keys,
                      options.limits)
    install_error_handlers(app)
    _install_routes(app, fleet, options)
    install_batch_routes(app, batches, options.limits)
    return FleetApp(front, app, fleet)


def _install_routes(app: FastAPI, fleet: Fleet, options: FleetServeOptions) -> None:
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "andante-fleet",
             "upstreams": [fleet.upstreams[i].url for i in fleet.groups[m].members
                           if m in fleet.upstreams[i].models]}
            for m in fleet.models]}

    @app.get("/health")
    async def health() -> Response:
        if fleet.alive:
            return Response(status_code=200)
        return JSONResponse({"error": "every upstream is down"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(fleet), media_type=CONTENT_TYPE)

    @app.get("/api/stats")
    async def stats() -> dict[str, Any]:
        return fleet.stats()


def render_metrics(fleet: Fleet) -> bytes:
    """The fleet's load as vLLM names it (summed over upstreams), and per upstream."""
    lines: list[str] = []
    totals = [u.stats() for u in fleet.upstreams if u.alive]
    running = sum(s.num_running for s in totals)
    waiting = sum(s.num_waiting for s in totals) + fleet.num_queued
    kv = max((s.kv_usage for s in totals), default=0.0)
    for name, value, doc in (
        ("vllm:num_requests_running", running, "Requests running on the upstreams."),
        ("vllm:num_requests_waiting", waiting, "Requests waiting (upstreams and queue)."),
        ("vllm:kv_cache_usage_perc", kv, "The fullest upstream's KV usage (1 = full)."),
    ):
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name} {float(value)}"]
    lines += ["# HELP andante:upstream_up Whether the upstream serves (1) or is down (0).",
              "# TYPE andante:upstream_up gauge"]
    lines += [f'andante:upstream_up{{upstream="{u.url}"}} {int(u.alive)}'
              for u in fleet.upstreams]
    lines += ["# HELP andante:upstream_in_flight Requests andante has in flight there.",
              "# TYPE andante:upstream_in_flight gauge"]
    lines += [f'andante:upstream_in_flight{{upstream="{u.url}"}} {u.num_in_flight}'
              for u in fleet.upstreams]
    return ("\n".join(lines) + "\n").encode()
