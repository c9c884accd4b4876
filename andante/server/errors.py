"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from andante.runtime.durable.errors import StoreError, StoreFull
from andante.server.protocol import FIELD_NAMES

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    507: "insufficient_storage",
}


class APIError(Exception):
    """Raised by handlers; becomes an OpenAI-style JSON error response."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    body = error_body(exc.status, exc.message, exc.param, exc.code)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def _param(loc: Sequence[int | str]) -> str | None:
    """The field path of a pydantic error location, without union-member tags."""
    parts = [str(p) for p in loc if isinstance(p, int) or p in FIELD_NAMES]
    return ".".join(parts) or None


def _most_telling(errors: Sequence[Any]) -> dict[str, Any]:
    """The first error that is not a union member's type mismatch (`stop`: "at most 4
    items" rather than "not a string"), else the first."""
    if not errors:
        return {"msg": "invalid request"}
    for error in errors:
        if not str(error.get("type", "")).endswith("_type"):
            return dict(error)
    return dict(errors[0])


def validation_error(errors: Sequence[Any]) -> APIError:
    """A 400 naming the offending field (pydantic or FastAPI errors)."""
    first = _most_telling(errors)
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"invalid JSON body: {first['msg']}", None, "invalid_json")
    param = _param(loc)
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "extra_forbidden":
        msg = "unknown field"
        param = ".".join(str(p) for p in loc) or None
    message = f"{param}: {msg}" if param else msg
    if first.get("type") == "extra_forbidden":
        return APIError(400, message, param, "unknown_field")
    if "input" in first and param:
        message += f" (got {first['input']!r:.80})"
    return APIError(400, message, param, "invalid_value")


def from_pydantic(exc: ValidationError) -> APIError:
    # the schema's lists are bounded and fail fast (protocol.py): few errors to build
    return validation_error(exc.errors(include_url=False, include_context=False))


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(list(exc.errors())))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(APIError(exc.status_code, str(exc.detail), None, None))

    async def on_store_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StoreError)
        if isinstance(exc, StoreFull):
            error = APIError(507, f"the batch store is full: {exc}", None, "store_full")
        else:
            error = APIError(503, f"the batch store is unavailable: {exc}", None,
                             "store_unavailable", headers={"Retry-After": "5"})
        return error_response(error)

    async def on_bug(_: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback after this answer; the client gets JSON, not text
        return error_response(APIError(500, f"internal error ({type(exc).__name__})", None,
                                       "internal_error"))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(StoreError, on_store_error)
    app.add_exception_handler(Exception, on_bug)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
