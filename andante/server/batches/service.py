"""The Batch API's service: files and batches in the durable store (OpenAI's shapes and
life cycle), with the feeder (`feeder.py`) that runs their requests.

`create` checks the input file against the batch (its endpoint, the served models) and
either records a `failed` batch with per-line errors, or records the batch and enqueues
its requests in one store transaction (`in_progress`). `cancel` moves a batch in
progress to `cancelling`; the feeder drops its queued requests and finalizes it as
`cancelled` (with the results it had) once none is left.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from andante.runtime.durable.records import (
    CANCELLED,
    CANCELLING,
    FAILED,
    IN_PROGRESS,
    VALIDATING,
    BatchRecord,
    FileRecord,
    RequestCounts,
    WorkItem,
    window_seconds,
)
from andante.runtime.durable.store import DurableStore
from andante.server.batches.feeder import BatchFeeder
from andante.server.batches.host import BatchHost, ItemRunning
from andante.server.batches.input import (
    ENDPOINTS,
    MAX_REPORTED,
    BatchInputError,
    InputLine,
    check_for_batch,
    parse_batch_file,
)
from andante.server.config import BatchOptions
from andante.server.errors import APIError


class BatchService:
    def __init__(self, state: BatchHost, store: DurableStore, options: BatchOptions,
                 wall: Callable[[], float] = time.time,
                 runner: Callable[[], ItemRunning] | None = None) -> None:
        self.state = state
        self.store = store
        self.wall = wall
        self.feeder = BatchFeeder(state, store, options, wall, runner)
        self.on_closed: Callable[[], None] | None = None  # after the store is closed

    def start(self) -> None:
        """Resume the store's unfinished batches and start feeding (on the loop)."""
        self.feeder.start()

    async def stop(self) -> None:
        await self.feeder.stop()
        self.store.close()
        if self.on_closed is not None:
            self.on_closed()

    @property
    def models(self) -> list[str]:
        return list(self.state.backend.served)

    # ---- files --------------------------------------------------------------------
    def upload(self, filename: str, purpose: str, content: bytes) -> FileRecord:
        if purpose != "batch":
            raise APIError(400, f"purpose: only 'batch' files can be uploaded here, got "
                           f"{purpose!r}", "purpose", "invalid_value")
        try:
            parse_batch_file(content)
        except BatchInputError as exc:
            raise APIError(400, f"the file is not a valid batch input: {exc}", "file",
                           exc.errors[0].code) from None
        record = FileRecord(f"file-{uuid.uuid4().hex}", filename, purpose, len(content),
                            int(self.wall()))
        self.store.put_file(record, content)
        return record

    def file(self, file_id: str) -> FileRecord:
        record = self.store.get_file(file_id)
        if record is None:
            raise APIError(404, f"no file with id {file_id!r}", "file_id", "file_not_found")
        return record

    def file_content(self, file_id: str) -> bytes:
        self.file(file_id)
        return self.store.file_content(file_id) or b""

    # ---- batches ------------------------------------------------------------------
    def create(self, input_file_id: str, endpoint: str, completion_window: str,
               metadata: dict[str, str] | None = None) -> BatchRecord:
        if endpoint not in ENDPOINTS:
            raise APIError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}, got "
                           f"{endpoint!r}", "endpoint", "invalid_value")
        try:
            window = window_seconds(completion_window)
        except ValueError as exc:
            raise APIError(400, str(exc), "completion_window", "invalid_value") from None
        record = self.file(input_file_id)
        if record.purpose != "batch":
            raise APIError(400, f"input_file_id: file {input_file_id!r} has purpose "
                           f"{record.purpose!r}, not 'batch'", "input_file_id", "invalid_value")
        lines = parse_batch_file(self.store.file_content(input_file_id) or b"")
        now = self.wall()
        batch = BatchRecord(f"batch_{uuid.uuid4().hex}", input_file_id, endpoint,
                            completion_window, int(now), int(now) + window,
                            model=_model_of(lines, self.state.backend.model_name),
                            metadata=metadata, counts=RequestCounts(total=len(lines)))
        batch.enter(VALIDATING, now)
        errors = check_for_batch(lines, endpoint, self.models)
        if errors:
            batch.errors = [e.to_api() for e in errors[:MAX_REPORTED]]
            batch.enter(FAILED, now)
            self.store.create_batch(batch, [])
            return batch
        batch.enter(IN_PROGRESS, now)
        default_model = self.state.backend.model_name
        self.store.create_batch(batch, [_work_item(batch.id, line, default_model)
                                        for line in lines])
        self.feeder.wake()
        return batch

    def get(self, batch_id: str) -> BatchRecord:
        batch = self.store.get_batch(batch_id)
        if batch is None:
            raise APIError(404, f"no batch with id {batch_id!r}", "batch_id", "batch_not_found")
        return batch

    def page(self, after: str | None, limit: int) -> dict[str, Any]:
        found = self.store.list_batches(after, limit + 1)
        data = [b.to_api() for b in found[:limit]]
        return {"object": "list", "data": data, "has_more": len(found) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    def cancel(self, batch_id: str) -> BatchRecord:
        batch = self.get(batch_id)
        if batch.status in (IN_PROGRESS, VALIDATING):
            batch.enter(CANCELLING, self.wall())
            self.store.save_batch(batch)
            self.feeder.forget(batch_id)
            self.feeder.wake()
        elif batch.status not in (CANCELLING, CANCELLED):
            raise APIError(409, f"batch {batch_id!r} is {batch.status}; only a batch in "
                           "progress can be cancelled", "batch_id", "invalid_state")
        return batch


def _work_item(batch_id: str, line: InputLine, default_model: str) -> WorkItem:
    return WorkItem(batch_id, line.custom_id, line.line, line.url,
                    json.dumps(line.body, separators=(",", ":")), line.model or default_model)


def _model_of(lines: list[InputLine], default: str) -> str:
    models = {line.model or default for line in lines}
    return models.pop() if len(models) == 1 else ",".join(sorted(models))
