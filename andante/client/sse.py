"""Server-Sent Events as OpenAI-compatible servers send them (`data: ...` lines)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

DONE = "[DONE]"


async def iter_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Each `data:` event as a JSON object, until `data: [DONE]` or the end."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
            continue
        if line or not data:
            continue  # comments, other fields, blank lines between events
        payload = "\n".join(data)
        data = []
        if payload == DONE:
            return
        yield json.loads(payload)
    if data and "\n".join(data) != DONE:
        yield json.loads("\n".join(data))


def chunk_text(event: dict[str, Any]) -> str | None:
    """The text a completion or chat chunk carries (None if it carries none)."""
    choices = event.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    if "text" in choice:
        return choice["text"] or None
    delta = choice.get("delta") or {}
    return delta.get("content") or None


def chunk_finish_reason(event: dict[str, Any]) -> str | None:
    choices = event.get("choices") or []
    return choices[0].get("finish_reason") if choices else None
