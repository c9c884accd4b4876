"""A batch input file: JSONL lines `{custom_id, method, url, body}`, checked line by line.

Every problem is reported with its 1-based line, an error code and the parameter at
fault, as OpenAI's batch `errors.data` entries (`{code, message, param, line}`): at
upload (`POST /v1/files`, purpose "batch") the file's format (a 400 listing the first
problems), and at `POST /v1/batches` what depends on the batch (a line whose url is
not the batch's endpoint, a model this server does not serve), which makes the batch
`failed` with those errors, as OpenAI does. Request bodies themselves are checked when
each request runs; a bad one gets a 400 line in the batch's error file.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
ENDPOINTS = (CHAT_URL, COMPLETIONS_URL)
MAX_LINES = 50_000  # OpenAI's limit on requests per batch
MAX_CUSTOM_ID = 512
MAX_REPORTED = 10  # errors listed in a 400's message / kept on a failed batch: the first ones


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    code: str
    message: str
    param: str | None = None

    def to_api(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param,
                "line": self.line}


@dataclass(frozen=True, slots=True)
class InputLine:
    line: int
    custom_id: str
    url: str
    body: dict[str, Any]

    @property
    def model(self) -> str | None:
        model = self.body.get("model")
        return model if isinstance(model, str) else None


class BatchInputError(Exception):
    """The file cannot be a batch: its line errors (the first `MAX_REPORTED`)."""

    def __init__(self, errors: list[LineError], total: int) -> None:
        self.errors = errors
        self.total = total
        more = f" (and {total - len(errors)} more)" if total > len(errors) else ""
        super().__init__("; ".join(f"line {e.line}: {e.message}" for e in errors) + more)


class Buffer(Protocol):
    def find(self, sub: bytes, start: int = ..., end: int = ...) -> int: ...
    def __getitem__(self, index: slice) -> bytes: ...
    def __len__(self) -> int: ...


def iter_lines(buf: Buffer, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The lines of `buf[start:end]` (split on LF, a trailing CR dropped), one copy each:
    a file of hundreds of megabytes is read through an mmap, never whole."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        newline = buf.find(b"\n", pos, end)
        stop = end if newline < 0 else newline
        line = buf[pos:stop]
        yield line[:-1] if line.endswith(b"\r") else line
        pos = stop + 1


def parse_batch_file(content: bytes) -> list[InputLine]:
    """Every request of the file, or `BatchInputError` naming the bad lines."""
    return scan_batch_lines(iter_lines(content))


def scan_batch_lines(raw_lines: Iterable[bytes], keep: bool = True) -> list[InputLine]:
    """The requests of these lines (none kept unless `keep`: checking an upload), or
    `BatchInputError` naming the bad lines."""
    lines: list[InputLine] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    num_requests = num_unreported = 0
    for number, data in enumerate(raw_lines, start=1):
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append(LineError(number, "invalid_file_format", f"the line is not UTF-8 "
                                    f"text (byte {exc.start})"))
            continue
        if not raw.strip():
            continue
        parsed = _parse_line(number, raw)
        if isinstance(parsed, LineError):
            errors.append(parsed)
        elif parsed.custom_id in seen:
            errors.append(LineError(number, "duplicate_custom_id", f"custom_id "
                                    f"{parsed.custom_id!r} is a duplicate of line "
                                    f"{seen[parsed.custom_id]}'s; each request of a batch "
                                    "needs its own", "custom_id"))
        else:
            seen[parsed.custom_id] = number
            num_requests += 1
            if keep:
                lines.append(parsed)
        if len(errors) > MAX_REPORTED:  # keep only what is reported; count the rest
            num_unreported += len(errors) - MAX_REPORTED
            del errors[MAX_REPORTED:]
    if not num_requests and not errors:
        errors.append(LineError(1, "empty_file", "the file has no requests"))
    if num_requests > MAX_LINES:
        errors.append(LineError(MAX_LINES + 1, "too_many_requests", f"a batch holds at most "
                                f"{MAX_LINES} requests, the file has {num_requests}"))
    if errors:
        raise BatchInputError(errors[:MAX_REPORTED], len(errors) + num_unreported)
    return lines


def _parse_line(number: int, raw: str) -> InputLine | LineError:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return LineError(number, "invalid_json_line", f"not valid JSON ({exc.msg} at column "
                         f"{exc.colno})")
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, 1,000-deep nesting
        return LineError(number, "invalid_json_line", f"not valid JSON here ({exc})"[:200])
    if not isinstance(obj, dict):
        return LineError(number, "invalid_request", "each line must be a JSON object")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        return LineError(number, "invalid_request", f"unknown field {unknown[0]!r}", unknown[0])
    custom_id, method, url, body = (obj.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return LineError(number, "invalid_custom_id", f"custom_id must be a non-empty string "
                         f"of at most {MAX_CUSTOM_ID} characters", "custom_id")
    if method != "POST":
        return LineError(number, "invalid_method", f"method must be 'POST', got {method!r}",
                         "method")
    if url not in ENDPOINTS:
        return LineError(number, "invalid_url", f"url must be one of {', '.join(ENDPOINTS)}, "
                         f"got {url!r:.80}", "url")
    if not isinstance(body, dict):
        return LineError(number, "invalid_body", "body must be a JSON object (the request "
                         "body of the url)", "body")
    return InputLine(number, custom_id, str(url), body)


def check_for_batch(lines: list[InputLine], endpoint: str,
                    models: Collection[str]) -> list[LineError]:
    """What makes these lines unfit for a batch on `endpoint` here: a url that is not the
    endpoint, a model not served."""
    errors: list[LineError] = []
    for item in lines:
        if item.url != endpoint:
            errors.append(LineError(item.line, "mismatched_endpoint", f"the url {item.url} is "
                                    f"not the batch's endpoint {endpoint}", "url"))
        elif item.model is not None and item.model not in models:
            errors.append(LineError(item.line, "model_not_found", f"the model {item.model!r} "
                                    f"is not served here ({', '.join(sorted(models))})",
                                    "body.model"))
        elif "model" in item.body and item.model is None:
            errors.append(LineError(item.line, "invalid_value", "body.model must be a string",
                                    "body.model"))
    return errors
