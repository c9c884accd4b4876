"""`multipart/form-data` bodies (RFC 7578), as `POST /v1/files` receives them.

The body lies in a buffer (an mmap of the temporary file the upload was streamed to):
parsing finds the boundaries and reads each part's small header block, and returns
where each part's content lies, never copying it. At most `MAX_FORM_PARTS` parts (a
body of 400k tiny parts is refused at the 17th), header blocks of at most
`MAX_PART_HEAD` bytes. Anything malformed is a `ValueError` with a message the route
turns into a 400. No dependency on python-multipart.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from typing import Protocol

CRLF = b"\r\n"
MAX_FORM_PARTS = 16  # an upload has two ("file", "purpose") and maybe expires_after's
MAX_PART_HEAD = 16 << 10


class Buffer(Protocol):
    def find(self, sub: bytes, start: int = ..., end: int = ...) -> int: ...
    def __getitem__(self, index: slice) -> bytes: ...
    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FormPart:
    """A part's name and filename, and where its content lies in the body."""

    name: str
    filename: str | None
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def text(self, body: Buffer, limit: int = 4096) -> str:
        """A small part's content as text (at most `limit` bytes are read)."""
        return body[self.start:min(self.end, self.start + limit)].decode("utf-8", "replace")


def boundary_of(content_type: str) -> str:
    """The boundary parameter of a `multipart/form-data` Content-Type."""
    header = Message()
    header["content-type"] = content_type
    if header.get_content_type() != "multipart/form-data":
        raise ValueError(f"Content-Type must be multipart/form-data, got "
                         f"{header.get_content_type()!r}")
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise ValueError("the multipart Content-Type has no boundary")
    return boundary


def parse_form(body: Buffer, content_type: str,
               max_parts: int = MAX_FORM_PARTS) -> dict[str, FormPart]:
    """The form's parts by field name (the first part of each name)."""
    delimiter = b"--" + boundary_of(content_type).encode("latin-1")
    pos = body.find(delimiter)
    parts: dict[str, FormPart] = {}
    num_parts = 0
    while pos >= 0:
        start = pos + len(delimiter)
        if body[start:start + 2] == b"--":  # the closing delimiter
            break
        pos = body.find(delimiter, start)
        if pos < 0:
            break
        num_parts += 1
        if num_parts > max_parts:
            raise ValueError(f"a form has at most {max_parts} parts")
        part = _parse_part(body, start, pos)
        parts.setdefault(part.name, part)
    if pos < 0 or not parts:
        raise ValueError("the multipart body is truncated or has no closing boundary")
    return parts


def _parse_part(body: Buffer, start: int, end: int) -> FormPart:
    if body[start:start + 2] != CRLF or body[end - 2:end] != CRLF or end - start < 4:
        raise ValueError("a multipart part is not framed by CRLF")
    blank = body.find(CRLF + CRLF, start, min(end, start + 2 + MAX_PART_HEAD))
    if blank < 0:
        raise ValueError(f"a multipart part has no blank line within {MAX_PART_HEAD} bytes "
                         "of its start")
    headers = Message()
    for line in body[start + 2:blank].decode("utf-8", errors="replace").split("\r\n"):
        key, colon, value = line.partition(":")
        if colon:
            headers[key.strip()] = value.strip()
    name = headers.get_param("name", header="content-disposition")
    if not isinstance(name, str) or not name:
        raise ValueError("a multipart part has no Content-Disposition name")
    filename = headers.get_param("filename", header="content-disposition")
    content_start = blank + 4
    return FormPart(name, filename if isinstance(filename, str) else None,
                    content_start, max(content_start, end - 2))
