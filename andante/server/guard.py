"""The HTTP edge, checked before any route runs: the API key, the POST body's type and
declared size. A refusal is an OpenAI-style JSON error, never a traceback.

With an API key (or a keys file: several tenants, each key's name recorded as the
owner of the files and batches it makes, `owner_of`) every path but `/health` needs
it (the live page, `/metrics`, `/api/stats` and `/openapi.json` too, unless
`public_metrics`). A POST must say
`Content-Type: application/json`: a web page can make a visitor's browser send a form or
`text/plain` to a local server without asking, but not JSON (the CORS preflight). The
one exception, `POST /v1/files` (Batch API uploads, multipart, up to `max_file_bytes`),
only stores a file: running it takes a JSON `POST /v1/batches`; and a `POST
/v1/batches/{id}/cancel` may come without a body (the `openai` client sends none).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

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
BODYLESS_POSTS = frozenset({"/sleep", "/wake_up"})  # dev mode (andante.server.sleep)


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

    def __init__(self, app: ASGIApp, keys: Mapping[bytes, str | None],
                 limits: HTTPLimits) -> None:
        self.app = app
        self.keys = dict(keys)  # key -> its tenant (None: the single key)
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            error = self._auth(scope, headers)
            if error is None and scope["method"] == "POST":
                error = self._body(scope["path"], headers)
            if error is not None:
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _auth(self, scope: Scope, headers: Headers) -> APIError | None:
        """None if the caller may go on (its tenant noted in the scope), else a 401."""
        path = scope["path"]
        if not self.keys or path in OPEN_PATHS:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        # headers arrive decoded as latin-1: encoding back gives the bytes the client sent
        sent = token.strip().encode("latin-1", errors="replace")
        found = False
        for key, owner in self.keys.items():  # every key compared: no timing hint
            if secrets.compare_digest(sent, key) and scheme.lower() == "bearer":
                found = True
                scope[OWNER_KEY] = owner
        if found or (self.limits.public_metrics and path in PUBLIC_PATHS):
            return None
        return APIError(401, "invalid or missing API key (Authorization: Bearer KEY)",
                        None, "invalid_api_key")

    def _body(self, path: str, headers: Headers) -> APIError | None:
        if (path.endswith(CANCEL_SUFFIX) or path in BODYLESS_POSTS) and _has_no_body(headers):
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
