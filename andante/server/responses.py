"""OpenAI response bodies and the SSE stream (`data: {...}` events, `data: [DONE]`)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from andante.server.admission import usage
from andante.server.errors import error_body
from andante.server.outputs import Delta
from andante.server.streams import RequestStream

FAILED = frozenset({"error", "rejected"})


@dataclass(slots=True)
class Reply:
    """The identity of one response: id, object kind, creation time, model."""

    request_id: str
    chat: bool
    model: str
    num_prompt_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": self.request_id, "object": self.object, "created": self.created,
                "model": self.model, "choices": [choice]}

    def usage_chunk(self, num_output: int) -> dict[str, Any]:
        return {"id": self.request_id, "object": self.object, "created": self.created,
                "model": self.model, "choices": [], "usage": usage(self.num_prompt_tokens,
                                                                    num_output)}

    def full(self, text: str, finish: str, num_output: int) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                      "content": text}, "logprobs": None, "finish_reason": finish}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            kind = "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created,
                "model": self.model, "choices": [choice],
                "usage": usage(self.num_prompt_tokens, num_output)}


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _failure_event(delta: Delta) -> str:
    reason = delta.finish_reason or "error"
    message = "the engine failed" if reason == "error" else "the request was refused"
    return sse(error_body(500 if reason == "error" else 400, message, None, reason))


async def stream_events(
    reply: Reply,
    stream: RequestStream,
    include_usage: bool,
    continuous_usage: bool,
    on_close: Callable[[], None],
) -> AsyncIterator[str]:
    """One SSE event per non-empty text delta; the finish reason rides on the last."""
    num_output = 0
    first = True
    try:
        while True:
            parts: list[str] = []
            done = False
            for delta in await stream.next_batch():
                num_output = delta.num_output_tokens
                if delta.finish_reason in FAILED:
                    parts.append(_failure_event(delta))
                    done = True
                    break
                if reply.chat and first:
                    parts.append(sse(reply.chunk("", None, role=True)))
                    first = False
                parts.extend(_delta_events(reply, delta, continuous_usage))
                done = delta.finish_reason is not None
            if parts:
                yield "".join(parts)
            if done:
                break
        if include_usage:
            yield sse(reply.usage_chunk(num_output))
        yield "data: [DONE]\n\n"
    finally:
        on_close()


def _delta_events(reply: Reply, delta: Delta, continuous_usage: bool) -> list[str]:
    events: list[dict[str, Any]] = []
    finish = delta.finish_reason
    if reply.chat:
        if delta.text:
            events.append(reply.chunk(delta.text, None))
        if finish is not None:
            events.append(reply.chunk(None, finish))
    elif delta.text or finish is not None:
        events.append(reply.chunk(delta.text, finish))
    if continuous_usage:
        for event in events:
            event["usage"] = usage(reply.num_prompt_tokens, delta.num_output_tokens)
    return [sse(e) for e in events]


async def collect(stream: RequestStream) -> tuple[str, Delta]:
    """Wait for the whole output: (text, final delta)."""
    parts: list[str] = []
    while True:
        for delta in await stream.next_batch():
            parts.append(delta.text)
            if delta.finish_reason is not None:
                return "".join(parts), delta
