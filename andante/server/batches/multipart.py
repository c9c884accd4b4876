"""`multipart/form-data` bodies (RFC 7578), as `POST /v1/files` receives them.

The body is already read, within its size limit; parsing it is a split on the boundary
and a header block per part (no dependency on python-multipart). Anything malformed is
a `ValueError` with a message the route turns into a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message

CRLF = b"\r\n"


@dataclass(frozen=True, slots=True)
class FormPart:
    name: str
    filename: str | None
    content: bytes


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


def parse_form(body: bytes, content_type: str) -> dict[str, FormPart]:
    """The form's parts by field name (the first part of each name)."""
    delimiter = b"--" + boundary_of(content_type).encode("latin-1")
    pieces = body.split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        raise ValueError("the multipart body is truncated or has no closing boundary")
    parts: dict[str, FormPart] = {}
    for piece in pieces[1:-1]:
        part = _parse_part(piece)
        parts.setdefault(part.name, part)
    return parts


def _parse_part(piece: bytes) -> FormPart:
    if not piece.startswith(CRLF) or not piece.endswith(CRLF):
        raise ValueError("a multipart part is not framed by CRLF")
    head, sep, content = piece[2:-2].partition(CRLF + CRLF)
    if not sep:
        if not piece[2:].startswith(CRLF):  # no blank line after the headers
            raise ValueError("a multipart part has no blank line after its headers")
        head, content = b"", piece[4:-2]
    headers = Message()
    for line in head.decode("utf-8", errors="replace").split("\r\n"):
        key, colon, value = line.partition(":")
        if colon:
            headers[key.strip()] = value.strip()
    name = headers.get_param("name", header="content-disposition")
    if not isinstance(name, str) or not name:
        raise ValueError("a multipart part has no Content-Disposition name")
    filename = headers.get_param("filename", header="content-disposition")
    return FormPart(name, filename if isinstance(filename, str) else None, content)
