"""The HTTP edge, checked before any route runs: the API key, the POST body's type and
declared size. A refusal is an OpenAI-style JSON error, never a traceback.

With an API key every path but `/health` needs it (the live page, `/metrics`,
`/api/stats` and `/openapi.json` too, unless `public_metrics`). A POST must say
`Content-Type: application/json`: a web page can make a visitor's browser send a form or
`text/plain` to a local server without asking, but not JSON (the CORS preflight). The
one exception, `POST /v1/files` (Batch API uploads, multipart, up to `max_file_bytes`),
only stores a file: running it takes a JSON `POST /v1/batches`; and a `POST
/v1/batches/{id}/cancel` may come without a body (the `openai` client sends none).
"""

from __future__ import annotations

import secrets

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from andante.server.config import HTTPLimits
from andante.server.errors import APIError, error_response

OPEN_PATHS = frozenset({"/health"})
PUBLIC_PATHS = frozenset({"/", "/metrics", "/api/stats", "/openapi.json"})
JSON = "application/json"
MULTIPART = "multipart/form-data"
UPLOAD_PATH = "/v1/files"
CANCEL_SUFFIX = "/cancel"


def _has_no_body(headers: Headers) -> bool:
    return ("transfer-encoding" not in headers
            and headers.get("content-length", "0").strip() in ("", "0"))


OWNER_KEY = "andante.owner"  # in the ASGI scope: the name of the API key that authenticated


def owner_of(scope: Scope) -> str | None:
    """Who is calling, for the Batch API's files and batches: the name of the caller's
    key with a keys file, None (everyone is one tenant) otherwise."""
    owner = scope.get(OWNER_KEY)
    return owner if isinstance(owner, str) else None


def too_large(size: int, limit: int, option: str = "--max-body-bytes") -> APIError:
    """413 for a body of `size` bytes (declared, or read so far) over `limit`."""
    return APIError(413, f"the request body has at least {size} bytes; the limit is {limit} "
                    f"({option})", None, "request_too_large")


class EdgeGuard:
    """ASGI middleware: refuses unauthenticated, non-JSON or oversized requests."""

    def __init__(self, app: ASGIApp, api_key: str | None, limits: HTTPLimits) -> None:
        self.app = app
        self.key = None if api_key is None else api_key.encode("utf-8")
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.check(scope["path"], scope["method"], Headers(scope=scope))
            if error is not None:
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, path: str, method: str, headers: Headers) -> APIError | None:
        return self._auth(path, headers) or (self._body(path, headers) if method == "POST"
                                                 else None)

    def _auth(self, path: str, headers: Headers) -> APIError | None:
        if self.key is None or path in OPEN_PATHS:
            return None
        if self.limits.public_metrics and path in PUBLIC_PATHS:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        # headers arrive decoded as latin-1: encoding back gives the bytes the client sent
        sent = token.strip().encode("latin-1", errors="replace")
        if scheme.lower() == "bearer" and secrets.compare_digest(sent, self.key):
            return None
        return APIError(401, "invalid or missing API key (Authorization: Bearer KEY)",
                        None, "invalid_api_key")

    def _body(self, path: str, headers: Headers) -> APIError | None:
        if path.endswith(CANCEL_SUFFIX) and _has_no_body(headers):
            return None
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        upload = path == UPLOAD_PATH  # the one multipart route (the Batch API's files)
        expected = MULTIPART if upload else JSON
        if kind != expected:
            return APIError(415, f"Content-Type must be {expected}, got {kind or 'none'!r}",
                            None, "unsupported_media_type")
        limit = self.limits.max_file_bytes if upload else self.limits.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return too_large(int(declared), limit,
                             "--max-file-bytes" if upload else "--max-body-bytes")
        return None
