"""What the durable queue stores: files, batches, work items and their outcomes.

The records are plain data (JSON-friendly); their shapes follow the OpenAI Batch API
(`File`, `Batch` with its status life cycle and `request_counts`), so the HTTP layer
turns them into response bodies without translation. Times are Unix seconds (wall
clock), as the API reports them and as a restarted process can compare them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

# the Batch status life cycle (OpenAI): validating -> in_progress -> finalizing ->
# completed; or failed (validation), expired (window over), cancelling -> cancelled
VALIDATING, IN_PROGRESS = "validating", "in_progress"
FINALIZING, COMPLETED = "finalizing", "completed"
FAILED, EXPIRED, CANCELLING, CANCELLED = "failed", "expired", "cancelling", "cancelled"
STATUSES = (VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED, FAILED, EXPIRED, CANCELLING,
            CANCELLED)
OPEN_STATUSES = frozenset({VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING})

# an outcome's kind: counted in request_counts.completed / .failed, or dropped by a cancel
DONE_OK, DONE_FAILED, DONE_CANCELLED = "completed", "failed", "cancelled"
OUTCOME_KINDS = (DONE_OK, DONE_FAILED, DONE_CANCELLED)

_WINDOW = re.compile(r"([0-9]{1,9})([smhd])", re.ASCII)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW_S = 30 * 86400


def window_seconds(window: str) -> int:
    """`"24h"` -> 86400. OpenAI accepts only "24h"; andante also takes N s/m/h/d (ASCII
    digits), up to `MAX_WINDOW_S`."""
    match = _WINDOW.fullmatch(window)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"completion_window must be like '24h' (a positive number of s, m, "
                         f"h or d), got {window!r:.40}")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_WINDOW_S:
        raise ValueError(f"completion_window is at most {MAX_WINDOW_S // 86400}d, got "
                         f"{window!r}")
    return seconds


@dataclass(slots=True)
class FileRecord:
    """An uploaded file (purpose "batch") or one the server wrote ("batch_output");
    `expires_at`: when the store deletes it (None: never); `owner`: the API key's name
    that uploaded it (or the batch's that wrote it; None: single-tenant)."""

    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None = None
    owner: str | None = None

    def doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> FileRecord:
        return cls(**{k: v for k, v in doc.items() if k in cls.__dataclass_fields__})

    def to_api(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed",
                "expires_at": self.expires_at, "status_details": None}


@dataclass(slots=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0  # dropped by a cancel: in neither output file

    @property
    def done(self) -> int:
        return self.completed + self.failed + self.cancelled

    @property
    def remaining(self) -> int:
        return self.total - self.done


@dataclass(slots=True)
class BatchRecord:
    """A batch as OpenAI describes it; `counts` are kept by the store (the one place a
    result is counted, in the same transaction that makes it durable)."""

    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    created_at: int
    expires_at: int
    status: str = VALIDATING
    model: str | None = None
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: dict[str, int] = field(default_factory=dict)  # status -> when it was entered
    counts: RequestCounts = field(default_factory=RequestCounts)
    owner: str | None = None  # the API key's name that created it (None: single-tenant)

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    def enter(self, status: str, now: float) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown batch status {status!r}")
        self.status = status
        self.times.setdefault(status, int(now))

    def doc(self) -> dict[str, Any]:
        """The record minus its counts, as stored."""
        out = asdict(self)
        out.pop("counts")
        return out

    @classmethod
    def from_doc(cls, doc: dict[str, Any], counts: RequestCounts) -> BatchRecord:
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        return cls(**known, counts=counts)

    def to_api(self) -> dict[str, Any]:
        times = self.times
        counts = self.counts
        errors = None if not self.errors else {"object": "list", "data": self.errors}
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "in_progress_at": times.get(IN_PROGRESS), "expires_at": self.expires_at,
            "finalizing_at": times.get(FINALIZING), "completed_at": times.get(COMPLETED),
            "failed_at": times.get(FAILED), "expired_at": times.get(EXPIRED),
            "cancelling_at": times.get(CANCELLING), "cancelled_at": times.get(CANCELLED),
            "request_counts": {"total": counts.total, "completed": counts.completed,
                               "failed": counts.failed},
            "metadata": self.metadata, "model": self.model,
        }


@dataclass(slots=True)
class WorkItem:
    """One request of a batch in the queue; `ref` is the store's handle for its
    acknowledgement (a row id, a stream entry id)."""

    batch_id: str
    custom_id: str
    line: int  # 1-based line of the input file
    url: str
    body: str  # the request body, JSON text
    model: str
    ref: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one work item: its output-file line (JSON text) and its kind."""

    custom_id: str
    line: int
    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in OUTCOME_KINDS:
            raise ValueError(f"outcome kind must be one of {OUTCOME_KINDS}, got {self.kind!r}")


@dataclass(frozen=True, slots=True)
class StatusSummary:
    """Batches in one status and their requests (for /metrics)."""

    status: str
    num_batches: int
    total: int
    completed: int
    failed: int
