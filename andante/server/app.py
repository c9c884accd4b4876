"""The app factory: one FastAPI app per server, owning its engine thread and registry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, Response

from andante.server.backend import Backend, build_backend
from andante.server.batches import create_batch_service, open_batch_store
from andante.server.batches.routes import install_batch_routes
from andante.server.config import ServeOptions
from andante.server.errors import install_error_handlers
from andante.server.guard import EdgeGuard
from andante.server.http_timing import HttpTiming
from andante.server.metrics import CONTENT_TYPE
from andante.server.openai_api import install_openai_routes
from andante.server.state import ServerState


def create_app(options: ServeOptions, backend: Backend | None = None) -> FastAPI:
    """A server app; `backend` defaults to `build_backend(options)`. The engine thread
    starts with the app's lifespan and stops with it."""
    opened = open_batch_store(options.batch)  # a state directory in use fails here, first
    try:
        state = ServerState.create(options, backend or build_backend(options))
    except BaseException:
        opened.store.close()
        raise
    batches = create_batch_service(state, opened)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.start(asyncio.get_running_loop())
        batches.start()  # resumes the store's unfinished batches
        try:
            yield
        finally:
            await batches.stop()
            state.stop()

    app = FastAPI(title="andante", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.andante = state
    app.state.batches = batches
    app.add_middleware(EdgeGuard, keys=options.keys_by_value, limits=options.limits)
    if options.trace_steps:  # the HTTP side of the front end's time, outermost
        app.add_middleware(HttpTiming, path=options.trace_steps)
    install_error_handlers(app)
    install_openai_routes(app, state)
    install_batch_routes(app, batches, options.limits)
    _install_ops_routes(app, state)
    if options.dev_mode:
        from andante.server.sleep import install_sleep_routes

        install_sleep_routes(app, state)
    return app


def _page() -> str:
    return (resources.files("andante.server") / "static" / "index.html").read_text("utf-8")


def _install_ops_routes(app: FastAPI, state: ServerState) -> None:
    page = _page()

    @app.get("/health")
    async def health() -> Response:
        if state.runner.is_alive:
            return Response(status_code=200)
        return JSONResponse({"error": "the engine is not running"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        # the batch collector reads the store: off the event loop
        page = await asyncio.to_thread(state.metrics.render)
        return Response(page, media_type=CONTENT_TYPE)

    @app.get("/api/stats")
    async def stats() -> dict[str, Any]:
        out = state.live.stats(state.hub.num_in_flight)
        out["model"] = state.backend.model_name
        out["policy"] = state.options.policy
        out["auth"] = bool(state.options.keys_by_value)
        out["cluster"] = state.runner.cluster_stats()
        return out

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)
