"""One batch request through the same path as an HTTP request: parse and tokenise on the
preparation thread, admission, the controller, the output stream; its outcome is the
line of the batch's output file (or error file).

The request runs with the batch's deadline as its SLO (`deadline`: seconds left until
the batch expires, or the body's own `slo.deadline` if sooner) and a low priority
(`BATCH_PRIORITY`; lower runs first), so the SLO-aware policies (EDF, Andes, Ascendra,
QLM) see batch work for what it is.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

from andante.runtime.durable.records import DONE_CANCELLED, DONE_FAILED, DONE_OK, Outcome, WorkItem
from andante.server.admission import new_request_id
from andante.server.batches.input import CHAT_URL
from andante.server.errors import APIError, error_body
from andante.server.openai_api import prepare_chat, prepare_completion
from andante.server.responses import Reply, collect
from andante.server.state import ServerState
from andante.server.streams import RequestStream

BATCH_PRIORITY = 100  # interactive requests default to 0; lower runs first
MIN_DEADLINE_S = 1e-3
ENGINE_FAILURES = frozenset({"error", "abort"})  # abort: the server is stopping


class EngineFailure(Exception):
    """The engine failed while serving the request (not the request's fault): retry."""


def line_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def response_outcome(item: WorkItem, status: int, request_id: str | None,
                     body: dict[str, Any]) -> Outcome:
    """The output line of a request that got an HTTP-like response (200 or an error)."""
    text = json.dumps({"id": line_id(), "custom_id": item.custom_id, "response": {
        "status_code": status, "request_id": request_id, "body": body}, "error": None})
    return Outcome(item.custom_id, item.line, DONE_OK if status == 200 else DONE_FAILED, text)


def batch_error_outcome(item: WorkItem, code: str, message: str) -> Outcome:
    """The line of a request that never ran (expired, cancelled); cancelled ones are in
    neither output file."""
    text = json.dumps({"id": line_id(), "custom_id": item.custom_id, "response": None,
                       "error": {"code": code, "message": message}})
    kind = DONE_CANCELLED if code == "batch_cancelled" else DONE_FAILED
    return Outcome(item.custom_id, item.line, kind, text)


class ItemRunner:
    """Runs work items on the server; `streams`: the batch requests in flight."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.streams: dict[str, RequestStream] = {}

    @property
    def num_not_started(self) -> int:
        """Batch requests still waiting for their first token."""
        return sum(1 for stream in self.streams.values() if not stream.started)

    async def run(self, item: WorkItem, seconds_left: float) -> Outcome:
        """The item's outcome; `EngineFailure` if the engine failed under it."""
        try:
            status, rid, body = await self._generate(item, seconds_left)
        except APIError as exc:
            status, rid = exc.status, None
            body = error_body(exc.status, exc.message, exc.param, exc.code)
        return response_outcome(item, status, rid, body)

    async def _generate(self, item: WorkItem, seconds_left: float
                        ) -> tuple[int, str, dict[str, Any]]:
        state = self.state
        chat = item.url == CHAT_URL
        prepare = prepare_chat if chat else prepare_completion
        body, prompt = await state.prepare(lambda raw: prepare(state.admission, raw),
                                           item.body.encode("utf-8"))
        if body.stream:
            raise APIError(400, "stream: streaming is not available in a batch", "stream",
                           "invalid_value")
        max_tokens = body.max_output_tokens if chat else body.max_tokens  # type: ignore[union-attr]
        rid = new_request_id("chatcmpl" if chat else "cmpl")
        req = state.admission.admit(body, prompt, max_tokens, rid, state.backend.clock.now())
        req.priority = max(req.priority, BATCH_PRIORITY)
        own = req.slo.deadline
        deadline = max(MIN_DEADLINE_S, seconds_left if own is None else min(own, seconds_left))
        req.slo = replace(req.slo, deadline=deadline)
        stream = state.submit(req)
        self.streams[rid] = stream
        try:
            text, last = await collect(stream)
        finally:
            del self.streams[rid]
            if not stream.finished:
                state.abort(rid)
        if last.finish_reason == "rejected":
            raise APIError(400, "the engine refused the request: it can never fit", None,
                           "rejected")
        if last.finish_reason in ENGINE_FAILURES:  # not the request's fault: it runs again
            raise EngineFailure(f"the engine failed while serving {item.custom_id!r} "
                                f"({last.finish_reason})")
        reply = Reply(rid, chat, req.model or state.backend.model_name, len(prompt))
        return 200, rid, reply.full(text, last.finish_reason or "stop", last.num_output_tokens)
