"""ASGI middleware timing each streamed response at the HTTP edge (the front end's side).

Design note. andante.perf.frontend_log fits the server's time around its engine from
two sides of each request: the engine's (when it took the request in, when it emitted
the first token) and the HTTP layer's, which this middleware records: when the request
reached the app (`received`) and when the first byte of its streamed body was sent
(`first_byte`), in wall seconds (`time.time()`, the clock both of vLLM's processes
stamp with). One JSON line per streamed (text/event-stream) response:
`{"kind": "http", "id": ..., "received": ..., "first_byte": ..., "path": ...}`, where
`id` is the response's own id, read from its first event (`"id": "cmpl-..."`): the
engine's request id, or its prefix in vLLM. Other responses are not recorded.

It imports nothing but the standard library, so vLLM's API server can load it:
`vllm serve ... --middleware andante.server.http_timing.HttpTiming` with the log's path
in `ANDANTE_HTTP_LOG` (the same file as the scheduler class's `step_log`: lines are
appended whole). `andante serve --trace-steps FILE` installs it on FILE itself.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import IO, Any

LOG_ENV = "ANDANTE_HTTP_LOG"
HTTP_KIND = "http"
_ID = re.compile(rb'"id"\s*:\s*"([^"]+)"')
_STREAM = b"text/event-stream"

Message = dict[str, Any]


class HttpTiming:
    """ASGI middleware: one `http` record per streamed response (module note). `path`:
    the log file (default: $ANDANTE_HTTP_LOG; neither: the middleware passes through)."""

    def __init__(self, app: Callable[..., Any], path: str | None = None) -> None:
        self.app = app
        target = path or os.environ.get(LOG_ENV)
        self._log: IO[str] | None = None
        if target:
            self._log = open(target, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    async def __call__(self, scope: Message, receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if self._log is None or scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        received = time.time()
        streamed = False
        pending = True  # the first body byte not yet seen

        async def timed_send(message: Message) -> None:
            nonlocal streamed, pending
            if message["type"] == "http.response.start":
                streamed = any(k.lower() == b"content-type" and v.startswith(_STREAM)
                               for k, v in message.get("headers", ()))
            elif pending and streamed and message["type"] == "http.response.body" \
                    and message.get("body"):
                pending = False
                await send(message)
                self._write(message["body"], received, time.time(), scope.get("path", ""))
                return
            await send(message)

        await self.app(scope, receive, timed_send)

    def _write(self, body: bytes, received: float, sent: float, path: str) -> None:
        found = _ID.search(body)
        if found is None or self._log is None:
            return
        record = {"kind": HTTP_KIND, "id": found.group(1).decode("utf-8", "replace"),
                  "received": received, "first_byte": sent, "path": path}
        self._log.write(json.dumps(record) + "\n")
