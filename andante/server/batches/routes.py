"""The Batch API routes: /v1/files (upload, object, content) and /v1/batches (create,
retrieve, list, cancel), with OpenAI's shapes and errors."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from andante.server.batches.multipart import parse_form
from andante.server.batches.service import BatchService
from andante.server.config import HTTPLimits
from andante.server.errors import APIError
from andante.server.openai_api import parse_body, read_body
from andante.server.protocol import request_schema

MAX_METADATA_KEYS = 16  # OpenAI's limits on metadata
ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"  # ids this server hands out (file-..., batch_...)
UPLOAD_SCHEMA = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": ["batch"]}}}}}}}
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512


class CreateBatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(default=None, max_length=MAX_METADATA_KEYS)

    def check_metadata(self) -> None:
        for key, value in (self.metadata or {}).items():
            if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                raise APIError(400, f"metadata: keys have at most {MAX_METADATA_KEY} "
                               f"characters and values {MAX_METADATA_VALUE}", "metadata",
                               "invalid_value")


def batch_router(service: BatchService, limits: HTTPLimits) -> APIRouter:
    router = APIRouter(prefix="/v1")
    file_limits = HTTPLimits(max_body_bytes=limits.max_file_bytes,
                             header_timeout=limits.header_timeout,
                             body_timeout=max(limits.body_timeout, 300.0))

    file_id_path = Path(pattern=ID_PATTERN)
    batch_id_path = Path(pattern=ID_PATTERN)

    @router.post("/files", status_code=200, openapi_extra=UPLOAD_SCHEMA)
    async def upload(request: Request) -> dict[str, Any]:
        raw = await read_body(request, file_limits)
        try:
            form = parse_form(raw, request.headers.get("content-type", ""))
        except ValueError as exc:
            raise APIError(400, f"invalid multipart body: {exc}", None, "invalid_value") from None
        purpose = form.get("purpose")
        upload = form.get("file")
        if upload is None:
            raise APIError(400, "file: the form has no 'file' part", "file", "missing_field")
        if purpose is None:
            raise APIError(400, "purpose: the form has no 'purpose' field", "purpose",
                           "missing_field")
        name = upload.filename or "upload.jsonl"
        # checking a large file line by line takes a while: off the event loop
        record = await asyncio.to_thread(service.upload, name,
                                         purpose.content.decode("utf-8", "replace"),
                                         upload.content)
        return record.to_api()

    @router.get("/files/{file_id}")
    async def get_file(file_id: str = file_id_path) -> dict[str, Any]:
        return service.file(file_id).to_api()

    @router.get("/files/{file_id}/content")
    async def file_content(file_id: str = file_id_path) -> Response:
        return Response(service.file_content(file_id), media_type="application/octet-stream")

    @router.post("/batches", openapi_extra=request_schema(CreateBatchBody))
    async def create(request: Request) -> dict[str, Any]:
        body = parse_body(await read_body(request, limits), CreateBatchBody)  # type: ignore[type-var]
        body.check_metadata()
        return service.create(body.input_file_id, body.endpoint, body.completion_window,
                              body.metadata).to_api()

    @router.get("/batches/{batch_id}")
    async def retrieve(batch_id: str = batch_id_path) -> dict[str, Any]:
        return service.get(batch_id).to_api()

    @router.get("/batches")
    async def list_batches(after: str | None = None,
                           limit: int = Query(default=20, ge=1, le=100)) -> dict[str, Any]:
        return service.page(after, limit)

    @router.post("/batches/{batch_id}/cancel")
    async def cancel(batch_id: str = batch_id_path) -> dict[str, Any]:
        return service.cancel(batch_id).to_api()

    return router


def install_batch_routes(app: FastAPI, service: BatchService, limits: HTTPLimits) -> None:
    app.include_router(batch_router(service, limits))
