"""The fleet server: `andante serve --upstream URL ...` (andante.runtime.upstream).

The same OpenAI-compatible edge as the engine server (API key, body limits, OpenAI-style
errors), in front of upstream servers instead of engines: /v1/models lists every model
the fleet serves, /v1/completions and /v1/chat/completions are routed by the cluster
layer and proxied (streams pass through as they arrive), /metrics exports the fleet's
load under vLLM's names (so a fleet can be another fleet's upstream) and /api/stats
each upstream's figures. A request for a model no upstream serves gets a 404 naming the
served ones; the SLO comes as andante's `slo` object or as `vllm_xargs` flat keys.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from andante.runtime.upstream.call import Call, Chunk, End, Event, Failure, slo_from
from andante.runtime.upstream.discovery import UpstreamInfo, UpstreamSpec
from andante.runtime.upstream.fleet import CLIENT_CLOSED, Fleet, FleetOptions
from andante.server.batches.routes import install_batch_routes
from andante.server.config import BatchOptions, HTTPLimits
from andante.server.errors import APIError, error_body, from_pydantic, install_error_handlers
from andante.server.fleet_batches import create_fleet_batch_service
from andante.server.guard import EdgeGuard
from andante.server.metrics import CONTENT_TYPE
from andante.server.openai_api import SSE_HEADERS, _watch_disconnect, read_body
from andante.server.protocol import SLOBody

CHARS_PER_TOKEN = 4  # the prompt's length for routing, without the upstream's tokenizer


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


def create_fleet_app(options: FleetServeOptions, infos: list[UpstreamInfo]) -> FastAPI:
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
    app.add_middleware(EdgeGuard, keys=keys, limits=options.limits)
    install_error_handlers(app)
    _install_routes(app, fleet, options)
    install_batch_routes(app, batches, options.limits)
    return app


def _install_routes(app: FastAPI, fleet: Fleet, options: FleetServeOptions) -> None:
    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await _proxy(fleet, options, request, "/v1/completions")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        return await _proxy(fleet, options, request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "andante-fleet",
             "upstreams": [fleet.upstreams[i].url for i in fleet.groups[m].members]}
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


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise APIError(400, f"invalid JSON body: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", None, "invalid_value")
    return body


def _model(fleet: Fleet, body: dict[str, Any]) -> str:
    model = body.get("model")
    served = fleet.models
    if model is None and len(served) == 1:
        return served[0]
    if model not in fleet.groups:
        raise APIError(404, f"model {model!r} is not served here; served models: "
                       f"{', '.join(served)}", "model", "model_not_found")
    return str(model)


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise APIError(400, f"max_tokens must be a positive integer, got {value!r}",
                       "max_tokens", "invalid_value")
    return value


def _prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's length in tokens, estimated (routing only)."""
    if "messages" in body:
        return len(json.dumps(body["messages"])) // CHARS_PER_TOKEN
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return len(json.dumps(prompt)) // CHARS_PER_TOKEN


def _slo(body: dict[str, Any]) -> Any:
    raw = body.pop("slo", None)
    try:
        given = None if raw is None else SLOBody.model_validate(raw)
        from andante.core.sampling import SLO

        return slo_from(body, None if given is None else SLO(**given.model_dump()))
    except ValidationError as exc:
        error = from_pydantic(exc)
        raise APIError(400, f"slo: {error.message}", "slo", "invalid_value") from None
    except ValueError as exc:
        raise APIError(400, str(exc), "vllm_xargs", "invalid_value") from None


def _new_call(fleet: Fleet, options: FleetServeOptions, body: dict[str, Any],
              path: str) -> tuple[Call, int, int | None]:
    model = _model(fleet, body)
    slo = _slo(body)
    max_tokens = _max_tokens(body)
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise APIError(400, f"priority must be an integer, got {priority!r}", "priority",
                       "invalid_value")
    body["model"] = model
    arrival = fleet.clock.now()
    prefix = "chatcmpl" if path.endswith("chat/completions") else "cmpl"
    window = slo.deadline if slo.deadline is not None else options.fleet.retry_window_s
    call = Call(f"{prefix}-{uuid.uuid4().hex}", model, path, body, slo, body.get("stream") is True,
                arrival, arrival + window)
    return call, _prompt_tokens(body), max_tokens


async def _proxy(fleet: Fleet, options: FleetServeOptions, request: Request,
                 path: str) -> Response:
    if not fleet.alive:
        raise APIError(503, "every upstream is down", None, "upstream_unavailable")
    body = _json_body(await read_body(request, options.limits))
    call, prompt_tokens, max_tokens = _new_call(fleet, options, body, path)
    priority = int(body.get("priority", 0))
    fleet.submit(call, prompt_tokens, max_tokens, priority)
    watcher = asyncio.create_task(_watch_disconnect(request,
                                                    lambda: fleet.abort(call.request_id)))
    try:
        first = await call.events.get()
    except BaseException:
        watcher.cancel()
        fleet.abort(call.request_id)
        raise
    if isinstance(first, Chunk):
        return StreamingResponse(_relay(fleet, call, first, watcher),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    watcher.cancel()
    if isinstance(first, Failure):
        if first.status == CLIENT_CLOSED:
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse(error_body(first.status, first.message, None, first.code),
                            status_code=first.status)
    assert not isinstance(first, End)
    return Response(first.content, status_code=first.status, media_type=first.content_type)


async def _relay(fleet: Fleet, call: Call, first: Chunk, watcher: asyncio.Task[None]
                 ) -> AsyncIterator[bytes]:
    """The upstream's SSE bytes as they arrive; a failure after the first ends the
    stream with an OpenAI-style error event."""
    try:
        yield first.data
        while True:
            event: Event | None = await call.events.get()
            if isinstance(event, Chunk):
                data, event = _coalesce(call, event.data)
                yield data
                if event is None:
                    continue
            if isinstance(event, Failure):
                if event.status != CLIENT_CLOSED:
                    error = error_body(event.status, event.message, None, event.code)
                    yield b"data: " + json.dumps(error).encode() + b"\n\n"
                return
            else:
                return
    finally:
        watcher.cancel()
        if not call.finished:
            fleet.abort(call.request_id)


def _coalesce(call: Call, data: bytes) -> tuple[bytes, Event | None]:
    """`data` and the chunks already queued behind it as one write (a client that
    lags gets them in one send), and the end event met on the way, if any."""
    events = call.events
    if events.empty():
        return data, None
    parts = [data]
    while not events.empty():
        event = events.get_nowait()
        if not isinstance(event, Chunk):
            return b"".join(parts), event
        parts.append(event.data)
    return b"".join(parts), None


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
