"""andante.server.http_timing: one record per streamed response, with the response's id,
when the request reached the app and when its first body byte went out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from andante.server.http_timing import LOG_ENV, HttpTiming


def _app(content_type: bytes, chunks: list[bytes]):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type)]})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


def _call(middleware: HttpTiming) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware({"type": "http", "path": "/v1/completions"}, receive, send))
    return sent


def test_a_streamed_response_is_recorded_once_with_its_id(tmp_path: Path):
    log = tmp_path / "steps.jsonl"
    events = [b'data: {"id":"cmpl-42","choices":[{"text":"a"}]}\n\n',
              b'data: {"id":"cmpl-42","choices":[{"text":"b"}]}\n\n']
    sent = _call(HttpTiming(_app(b"text/event-stream; charset=utf-8", events), str(log)))
    assert [m.get("body") for m in sent[1:]] == [*events, b""]  # passed through unchanged
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["kind"] == "http" and record["id"] == "cmpl-42"
    assert record["path"] == "/v1/completions"
    assert 0 <= record["first_byte"] - record["received"] < 5


def test_other_responses_and_no_log_pass_through_unrecorded(tmp_path, monkeypatch):
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    _call(HttpTiming(_app(b"application/json", [b'{"id":"cmpl-1"}'])))
    assert log.read_text() == ""
    monkeypatch.delenv(LOG_ENV)
    sent = _call(HttpTiming(_app(b"text/event-stream", [b'data: {"id":"x"}\n\n'])))
    assert len(sent) == 3
