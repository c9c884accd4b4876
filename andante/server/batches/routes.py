"""The Batch API routes: /v1/files (upload, list, object, content, delete) and
/v1/batches (create, retrieve, list, cancel), with OpenAI's shapes and errors.

An upload streams to a temporary file (at most `max_file_bytes`, within
`upload_timeout`), then a worker thread parses the form, checks the batch input and
stores it: never whole in memory, never on the event loop; at most `max_uploads` are
received at once (429 beyond). Every call to the store runs on a worker thread (a
batch's creation parses and writes the whole file; a short read may wait for another
thread's long write): none holds the event loop.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path as FilePath
from typing import Any

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from andante.server.batches.service import BatchService
from andante.server.config import HTTPLimits
from andante.server.errors import APIError
from andante.server.guard import owner_of
from andante.server.openai_api import parse_body, read_body, receive_body
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


class UploadSlots:
    """How many uploads are being received; 429 beyond `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.num_active = 0

    def take(self) -> None:
        if self.num_active >= self.limit:
            raise APIError(429, f"{self.num_active} uploads are being received; the limit is "
                           f"{self.limit} (--max-uploads); retry shortly", None,
                           "too_many_uploads", headers={"Retry-After": "5"})
        self.num_active += 1

    def give_back(self) -> None:
        self.num_active -= 1


async def _receive_upload(request: Request, service: BatchService, limits: HTTPLimits,
                          slots: UploadSlots) -> dict[str, Any]:
    slots.take()
    try:
        with tempfile.NamedTemporaryFile(prefix="andante-upload-") as spool:
            await receive_body(request, spool.write, limits.max_file_bytes,
                               limits.upload_timeout, "--max-file-bytes", "--upload-timeout")
            spool.flush()
            record = await asyncio.to_thread(service.receive_upload, FilePath(spool.name),
                                             request.headers.get("content-type", ""),
                                             owner_of(request.scope))
    finally:
        slots.give_back()
    return record.to_api()


def batch_router(service: BatchService, limits: HTTPLimits, slots: UploadSlots) -> APIRouter:
    router = APIRouter(prefix="/v1")
    file_id_path = Path(pattern=ID_PATTERN)
    batch_id_path = Path(pattern=ID_PATTERN)

    @router.post("/files", status_code=200, openapi_extra=UPLOAD_SCHEMA)
    async def upload(request: Request) -> dict[str, Any]:
        return await _receive_upload(request, service, limits, slots)

    @router.get("/files")
    async def list_files(request: Request, after: str | None = Query(default=None,
                                                                      max_length=128),
                         limit: int = Query(default=20, ge=1, le=10_000),
                         purpose: str | None = Query(default=None, max_length=64)
                         ) -> dict[str, Any]:
        return await asyncio.to_thread(service.files_page, after, limit, purpose,
                                       owner_of(request.scope))

    @router.get("/files/{file_id}")
    async def get_file(request: Request, file_id: str = file_id_path) -> dict[str, Any]:
        record = await asyncio.to_thread(service.file, file_id, owner_of(request.scope))
        return record.to_api()

    @router.delete("/files/{file_id}")
    async def delete_file(request: Request, file_id: str = file_id_path) -> dict[str, Any]:
        return await asyncio.to_thread(service.delete_file, file_id, owner_of(request.scope))

    @router.get("/files/{file_id}/content")
    async def file_content(request: Request, file_id: str = file_id_path) -> Response:
        content = await asyncio.to_thread(service.file_content, file_id,
                                          owner_of(request.scope))
        return Response(content, media_type="application/octet-stream")

    @router.post("/batches", openapi_extra=request_schema(CreateBatchBody))
    async def create(request: Request) -> dict[str, Any]:
        body = parse_body(await read_body(request, limits), CreateBatchBody)  # type: ignore[type-var]
        body.check_metadata()
        batch = await asyncio.to_thread(service.create, body.input_file_id, body.endpoint,
                                        body.completion_window, body.metadata,
                                        owner_of(request.scope))
        return batch.to_api()

    @router.get("/batches/{batch_id}")
    async def retrieve(request: Request, batch_id: str = batch_id_path) -> dict[str, Any]:
        batch = await asyncio.to_thread(service.get, batch_id, owner_of(request.scope))
        return batch.to_api()

    @router.get("/batches")
    async def list_batches(request: Request, after: str | None = Query(default=None,
                                                                        max_length=128),
                           limit: int = Query(default=20, ge=1, le=100)) -> dict[str, Any]:
        return await asyncio.to_thread(service.page, after, limit, owner_of(request.scope))

    @router.post("/batches/{batch_id}/cancel")
    async def cancel(request: Request, batch_id: str = batch_id_path) -> dict[str, Any]:
        batch = await asyncio.to_thread(service.cancel, batch_id, owner_of(request.scope))
        return batch.to_api()

    return router


def install_batch_routes(app: FastAPI, service: BatchService, limits: HTTPLimits) -> None:
    app.state.uploads = slots = UploadSlots(limits.max_uploads)
    app.include_router(batch_router(service, limits, slots))
