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
import mmap
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
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
from andante.runtime.free_memory import release_free_memory
from andante.server.batches.feeder import BatchFeeder
from andante.server.batches.host import BatchHost, ItemRunning
from andante.server.batches.input import (
    ENDPOINTS,
    MAX_REPORTED,
    BatchInputError,
    InputLine,
    check_for_batch,
    iter_lines,
    parse_batch_file,
    scan_batch_lines,
)
from andante.server.batches.multipart import FormPart, parse_form
from andante.server.config import BatchOptions
from andante.server.errors import APIError


class BatchService:
    def __init__(self, state: BatchHost, store: DurableStore, options: BatchOptions,
                 wall: Callable[[], float] = time.time,
                 runner: Callable[[], ItemRunning] | None = None) -> None:
        self.state = state
        self.store = store
        self.wall = wall
        self.options = options
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
    def upload(self, filename: str, purpose: str, content: bytes, owner: str | None = None,
               expires_after: int | None = None) -> FileRecord:
        """Check and store a batch input file held in memory (`andante batch`)."""
        record = self._new_file(filename, purpose, len(content), owner, expires_after)
        _check_batch_input(iter_lines(content))
        self.store.put_file(record, content)
        return record

    def receive_upload(self, path: Path, content_type: str, owner: str | None = None
                       ) -> FileRecord:
        """Check and store the file of a `multipart/form-data` body streamed to `path`
        (`POST /v1/files`), reading it through an mmap: never whole in memory. Runs on
        a worker thread."""
        with open(path, "rb") as source, _mapped(source) as body:
            try:
                form = parse_form(body, content_type)
            except ValueError as exc:
                raise APIError(400, f"invalid multipart body: {exc}", None,
                               "invalid_value") from None
            part, purpose = _required(form, "file"), _required(form, "purpose").text(body)
            record = self._new_file(part.filename or "upload.jsonl", purpose, part.size,
                                    owner, _expires_after(form, body))
            _check_batch_input(iter_lines(body, part.start, part.end))
            source.seek(part.start)
            self.store.put_file_from(record, source)
        release_free_memory()  # what checking and storing it allocated (worker thread)
        return record

    def _new_file(self, filename: str, purpose: str, size: int, owner: str | None,
                  expires_after: int | None) -> FileRecord:
        if purpose != "batch":
            raise APIError(400, f"purpose: only 'batch' files can be uploaded here, got "
                           f"{purpose!r:.80}", "purpose", "invalid_value")
        now = int(self.wall())
        keep = expires_after if expires_after is not None else self.options.file_retention_s
        return FileRecord(f"file-{uuid.uuid4().hex}", filename[:256], purpose, size, now,
                          None if keep is None else now + int(keep), owner)

    def file(self, file_id: str, owner: str | None = None) -> FileRecord:
        record = self.store.get_file(file_id)
        if record is None or not _visible(record.owner, owner):
            raise APIError(404, f"no file with id {shown_id(file_id)}", "file_id",
                           "file_not_found")
        return record

    def file_content(self, file_id: str, owner: str | None = None) -> bytes:
        self.file(file_id, owner)
        return self.store.file_content(file_id) or b""

    def files_page(self, after: str | None, limit: int, purpose: str | None = None,
                   owner: str | None = None) -> dict[str, Any]:
        found = _owned_page(self.store.list_files, after, limit,
                            lambda f: _visible(f.owner, owner)
                            and (purpose is None or f.purpose == purpose))
        data = [f.to_api() for f in found[:limit]]
        return {"object": "list", "data": data, "has_more": len(found) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    def delete_file(self, file_id: str, owner: str | None = None) -> dict[str, Any]:
        self.file(file_id, owner)
        self.store.delete_file(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    # ---- batches ------------------------------------------------------------------
    def create(self, input_file_id: str, endpoint: str, completion_window: str,
               metadata: dict[str, str] | None = None, owner: str | None = None
               ) -> BatchRecord:
        """Check the input file against the batch and record it (in progress, or failed
        with its line errors). Parses and writes the whole file: a worker thread's job."""
        if endpoint not in ENDPOINTS:
            raise APIError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}, got "
                           f"{endpoint!r}", "endpoint", "invalid_value")
        try:
            window = window_seconds(completion_window)
        except ValueError as exc:
            raise APIError(400, str(exc), "completion_window", "invalid_value") from None
        record = self.file(input_file_id, owner)
        if record.purpose != "batch":
            raise APIError(400, f"input_file_id: file {shown_id(input_file_id)} has purpose "
                           f"{record.purpose!r}, not 'batch'", "input_file_id", "invalid_value")
        lines = parse_batch_file(self.store.file_content(input_file_id) or b"")
        now = self.wall()
        batch = BatchRecord(f"batch_{uuid.uuid4().hex}", input_file_id, endpoint,
                            completion_window, int(now), int(now) + window,
                            model=_model_of(lines, self.state.backend.model_name),
                            metadata=metadata, counts=RequestCounts(total=len(lines)),
                            owner=owner)
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
        del lines
        release_free_memory()
        self.feeder.wake()
        return batch

    def get(self, batch_id: str, owner: str | None = None) -> BatchRecord:
        batch = self.store.get_batch(batch_id)
        if batch is None or not _visible(batch.owner, owner):
            raise APIError(404, f"no batch with id {shown_id(batch_id)}", "batch_id",
                           "batch_not_found")
        return batch

    def page(self, after: str | None, limit: int, owner: str | None = None) -> dict[str, Any]:
        found = _owned_page(self.store.list_batches, after, limit,
                            lambda b: _visible(b.owner, owner))
        data = [b.to_api() for b in found[:limit]]
        return {"object": "list", "data": data, "has_more": len(found) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    def cancel(self, batch_id: str, owner: str | None = None) -> BatchRecord:
        batch = self.get(batch_id, owner)
        if batch.status in (IN_PROGRESS, VALIDATING):
            batch.enter(CANCELLING, self.wall())
            self.store.save_batch(batch)
            self.feeder.forget(batch_id)
            self.feeder.wake()
        elif batch.status not in (CANCELLING, CANCELLED):
            raise APIError(409, f"batch {shown_id(batch_id)} is {batch.status}; only a batch in "
                           "progress can be cancelled", "batch_id", "invalid_state")
        return batch


def _check_batch_input(lines: Iterable[bytes]) -> None:
    try:
        scan_batch_lines(lines, keep=False)
    except BatchInputError as exc:
        raise APIError(400, f"the file is not a valid batch input: {exc}", "file",
                       exc.errors[0].code) from None


class _mapped:
    """An mmap of the whole file (an empty one: empty bytes)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.map: mmap.mmap | None = None

    def __enter__(self) -> Any:
        size = self.source.seek(0, 2)
        self.source.seek(0)
        if size == 0:
            return b""
        self.map = mmap.mmap(self.source.fileno(), 0, access=mmap.ACCESS_READ)
        return self.map

    def __exit__(self, *exc: object) -> None:
        if self.map is not None:
            self.map.close()


def _required(form: dict[str, FormPart], name: str) -> FormPart:
    part = form.get(name)
    if part is None:
        what = "part" if name == "file" else "field"
        raise APIError(400, f"{name}: the form has no {name!r} {what}", name, "missing_field")
    return part


MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 86400  # OpenAI's bounds on expires_after


def _expires_after(form: dict[str, FormPart], body: Any) -> int | None:
    """`expires_after[anchor]=created_at` and `expires_after[seconds]=N` (OpenAI)."""
    seconds = form.get("expires_after[seconds]")
    if seconds is None:
        return None
    anchor = form.get("expires_after[anchor]")
    if anchor is not None and anchor.text(body) != "created_at":
        raise APIError(400, "expires_after[anchor] must be 'created_at'",
                       "expires_after.anchor", "invalid_value")
    text = seconds.text(body, limit=16)
    if not (text.isascii() and text.isdigit()) or not (
            MIN_EXPIRY_S <= int(text) <= MAX_EXPIRY_S):
        raise APIError(400, f"expires_after[seconds] must be a whole number of seconds in "
                       f"[{MIN_EXPIRY_S}, {MAX_EXPIRY_S}], got {text!r}",
                       "expires_after.seconds", "invalid_value")
    return int(text)


def _visible(record_owner: str | None, caller: str | None) -> bool:
    """Whether a caller sees a record: single-tenant (no owner) sees everything; a key
    sees only its own."""
    return caller is None or record_owner == caller


def _owned_page(fetch: Callable[[str | None, int], list[Any]], after: str | None,
                limit: int, keep: Callable[[Any], bool]) -> list[Any]:
    """Up to `limit + 1` records that `keep` accepts, newest first, after `after`."""
    found: list[Any] = []
    while len(found) <= limit:
        page = fetch(after, 100)
        found += [record for record in page if keep(record)]
        if len(page) < 100:
            break
        after = page[-1].id
    return found[:limit + 1]


def shown_id(value: str, limit: int = 64) -> str:
    """An id as an error message quotes it: at most `limit` characters (it comes from
    the client)."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} chars)"


def _work_item(batch_id: str, line: InputLine, default_model: str) -> WorkItem:
    return WorkItem(batch_id, line.custom_id, line.line, line.url,
                    json.dumps(line.body, separators=(",", ":")), line.model or default_model)


def _model_of(lines: list[InputLine], default: str) -> str:
    models = {line.model or default for line in lines}
    return models.pop() if len(models) == 1 else ",".join(sorted(models))
