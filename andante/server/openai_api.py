"""The OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from andante.server.admission import Admission, new_request_id
from andante.server.config import HTTPLimits
from andante.server.errors import APIError, from_pydantic
from andante.server.guard import too_large
from andante.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    _Sampling,
    request_schema,
)
from andante.server.responses import FAILED, Reply, collect, stream_events
from andante.server.state import ServerState

Body = TypeVar("Body", bound=_Sampling)
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client went away
log = logging.getLogger("andante.server")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def read_body(request: Request, limits: HTTPLimits) -> bytes:
    """The raw body: at most `limits.max_body_bytes` (413), within `limits.body_timeout`
    seconds (408). A client gone mid-upload is a normal event: one log line, a 499."""
    chunks: list[bytes] = []
    await receive_body(request, chunks.append, limits.max_body_bytes, limits.body_timeout)
    return b"".join(chunks)


async def receive_body(request: Request, write: Callable[[bytes], object], max_bytes: int,
                       timeout: float, size_option: str = "--max-body-bytes",
                       timeout_option: str = "--body-timeout") -> int:
    """Pass the body's chunks to `write` as they arrive: at most `max_bytes` (413 naming
    `size_option`), within `timeout` seconds (408 naming `timeout_option`); its size."""
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(size, max_bytes, size_option)
                write(chunk)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s "
                       f"({timeout_option})", None, "request_timeout") from None
    except ClientDisconnect:
        client = request.client.host if request.client else "?"
        log.info("client %s went away while sending its request body", client)
        raise APIError(CLIENT_CLOSED_REQUEST, "the client closed the connection", None,
                       "client_closed_request") from None
    return size


def parse_body(raw: bytes, model: type[Body]) -> Body:
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise from_pydantic(exc) from None


async def _watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> None:
    """Abort the request as soon as its client goes away (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


async def _generate(
    state: ServerState, request: Request, body: _Sampling, prompt: list[int],
    max_tokens: int | None, chat: bool,
) -> Response:
    arrival = state.backend.clock.now()
    state.check_accepting()
    rid = new_request_id("chatcmpl" if chat else "cmpl")
    req = state.admission.admit(body, prompt, max_tokens, rid, arrival)
    stream = state.submit(req)
    reply = Reply(rid, chat, req.model or state.backend.model_name, len(prompt))

    def on_disconnect() -> None:  # the engine's "abort" delta then ends the stream
        if not stream.finished:
            state.runner.abort(rid)

    def on_close() -> None:  # nobody reads the stream any more
        watcher.cancel()
        if not stream.finished:
            state.abort(rid)

    watcher = asyncio.create_task(_watch_disconnect(request, on_disconnect))
    if body.stream:
        cont = body.stream_options is not None and body.stream_options.continuous_usage_stats
        events = stream_events(reply, stream, body.include_usage, cont, on_close)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        text, last = await collect(stream)
    finally:
        on_close()
    if last.finish_reason == "abort":
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if last.finish_reason in FAILED:
        raise APIError(500, "the engine failed while serving this request", None,
                       last.finish_reason)
    return JSONResponse(reply.full(text, last.finish_reason or "stop", last.num_output_tokens))


def prepare_completion(admission: Admission, raw: bytes) -> tuple[CompletionRequest, list[int]]:
    """Parse a /v1/completions body and tokenise its prompt (400/404 if invalid)."""
    body = parse_body(raw, CompletionRequest)
    admission.check_model(body.model)
    return body, admission.completion_prompt(body)


def prepare_chat(admission: Admission, raw: bytes) -> tuple[ChatCompletionRequest, list[int]]:
    """Parse a /v1/chat/completions body and apply its chat template (400/404 if invalid)."""
    body = parse_body(raw, ChatCompletionRequest)
    admission.check_model(body.model)
    return body, admission.chat_prompt(body)


def openai_router(state: ServerState) -> APIRouter:
    router = APIRouter(prefix="/v1")
    completion = functools.partial(prepare_completion, state.admission)
    chat = functools.partial(prepare_chat, state.admission)

    @router.post("/completions", response_model=None,
                 openapi_extra=request_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        body, prompt = await state.prepare(completion, await read_body(request, state.limits))
        return await _generate(state, request, body, prompt, body.max_tokens, chat=False)

    @router.post("/chat/completions", response_model=None,
                 openapi_extra=request_schema(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body, prompt = await state.prepare(chat, await read_body(request, state.limits))
        return await _generate(state, request, body, prompt, body.max_output_tokens, chat=True)

    @router.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": served.name, "object": "model", "created": 0,
            "owned_by": "andante", "max_model_len": served.limits.max_model_len,
        } for served in state.backend.served.values()]}

    return router


def install_openai_routes(app: FastAPI, state: ServerState) -> None:
    app.include_router(openai_router(state))
