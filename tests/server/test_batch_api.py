"""The Batch API through the real `openai` client against a server process (toy model,
SQLite state in a temporary directory): files, batches, paging, cancel, bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from andante.server.toy import TOY_TEXT
from tests.server.batch_helpers import (
    ServeProcess,
    batch_lines,
    finished,
    jsonl,
    output_lines,
    submit,
    upload,
    wait_batch,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    state = tmp_path_factory.mktemp("state")
    proc = ServeProcess("--state-dir", str(state), "--toy-step-ms", "1",
                        "--max-file-bytes", "100000")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _wait(client: openai.OpenAI, batch_id: str, timeout: float = 30.0) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)


def test_chat_batch_with_the_openai_client(client: openai.OpenAI) -> None:
    lines = batch_lines(12, "/v1/chat/completions", max_tokens=6)
    lines[3]["body"]["max_tokens"] = 100_000  # cannot fit: a 400 line in the error file
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
    assert client.files.retrieve(uploaded.id).filename == "in.jsonl"
    assert client.files.content(uploaded.id).content == jsonl(lines)
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "nightly"})
    assert batch.status == "in_progress" and batch.metadata == {"job": "nightly"}
    assert batch.expires_at == batch.created_at + 86400
    done = _wait(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (12, 11, 1)
    assert done.output_file_id and done.error_file_id
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(12) if i != 3]
    answer = out[0]["response"]
    assert answer["status_code"] == 200
    assert answer["body"]["choices"][0]["message"]["content"] == TOY_TEXT[:6]
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["req-3"]
    assert errors[0]["response"]["status_code"] == 400
    assert "max_tokens" in errors[0]["response"]["body"]["error"]["message"]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_list_is_paged_newest_first(client: openai.OpenAI, server: ServeProcess) -> None:
    ids = [submit(server.url, batch_lines(1))["id"] for _ in range(3)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    older = client.batches.list(limit=100, after=page.data[-1].id)
    assert older.data[0].id == ids[0]
    assert ids[0] in [b.id for b in client.batches.list(limit=1)]  # auto-paging walks on


def test_cancel(client: openai.OpenAI, server: ServeProcess) -> None:
    lines = batch_lines(300, max_tokens=64)
    batch = submit(server.url, lines)
    cancelled = client.batches.cancel(batch["id"])
    assert cancelled.status in ("cancelling", "cancelled")
    done = _wait(client, batch["id"])
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts is not None
    counts = done.request_counts
    assert counts.completed + counts.failed < 300
    assert len(output_lines(server.url, done.output_file_id)) == counts.completed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(_wait(client, submit(server.url, batch_lines(1))["id"]).id)


def test_expired_window(server: ServeProcess) -> None:
    batch = submit(server.url, batch_lines(400, max_tokens=64), window="1s")
    done = wait_batch(server.url, batch["id"], finished, timeout=60)
    assert done["status"] == "expired" and done["expired_at"] is not None
    errors = output_lines(server.url, done["error_file_id"])
    assert errors and {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert done["request_counts"]["completed"] + len(errors) == 400


@pytest.mark.parametrize(("content", "needle"), [
    (b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n{oops\n',
     "line 2: not valid JSON"),
    (jsonl([{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}]),
     "line 1: url must be one of"),
    (jsonl(batch_lines(2) + batch_lines(1)), "line 3: custom_id 'req-0' is a duplicate"),
    (jsonl([{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}]),
     "line 1: method must be 'POST'"),
    (b"\n\n", "no requests"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_bad_files_get_a_400_naming_the_line(server: ServeProcess, content: bytes,
                                             needle: str) -> None:
    reply = upload(server.url, content)
    assert reply.status_code == 400, reply.text
    assert needle in reply.json()["error"]["message"]


def test_bad_uploads_and_requests(server: ServeProcess) -> None:
    url = server.url
    assert upload(url, b"x" * 200_000).status_code == 413  # over --max-file-bytes
    assert upload(url, jsonl(batch_lines(1)), purpose="fine-tune").status_code == 400
    raw = httpx.post(f"{url}/v1/files", content=b"{}", timeout=10,
                     headers={"content-type": "multipart/form-data; boundary=x"})
    assert raw.status_code == 400 and "multipart" in raw.json()["error"]["message"]
    file_id = upload(url, jsonl(batch_lines(2))).json()["id"]
    for body, status in [({"input_file_id": file_id, "endpoint": "/v1/embeddings"}, 400),
                         ({"input_file_id": "file-nope", "endpoint": "/v1/completions"}, 404),
                         ({"input_file_id": file_id, "endpoint": "/v1/completions",
                           "completion_window": "soon"}, 400),
                         ({"input_file_id": file_id, "endpoint": "/v1/completions",
                           "extra": 1}, 400)]:
        reply = httpx.post(f"{url}/v1/batches", json=body, timeout=10)
        assert reply.status_code == status, reply.text
    assert httpx.get(f"{url}/v1/batches/batch_nope", timeout=10).status_code == 404
    assert httpx.get(f"{url}/v1/files/file-nope/content", timeout=10).status_code == 404
    assert httpx.get(f"{url}/v1/batches?limit=0", timeout=10).status_code == 400


def test_mismatched_endpoint_fails_the_batch_with_line_errors(server: ServeProcess) -> None:
    lines = batch_lines(2) + batch_lines(1, "/v1/chat/completions", prefix="chat")
    lines[0]["body"]["model"] = "gpt-nope"
    batch = submit(server.url, lines)
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    errors = batch["errors"]["data"]
    assert [(e["line"], e["code"]) for e in errors] == [(1, "model_not_found"),
                                                       (3, "mismatched_endpoint")]


def test_metrics_show_batch_progress(server: ServeProcess) -> None:
    batch = submit(server.url, batch_lines(5))
    wait_batch(server.url, batch["id"], finished)
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines()
                 if line.startswith("andante:batch"))
    assert float(lines['andante:batches{status="completed"}']) >= 1
    total = float(lines['andante:batch_requests{outcome="total",status="completed"}'])
    done = float(lines['andante:batch_requests{outcome="completed",status="completed"}'])
    assert total >= 5 and done >= 5
    assert "andante:batches_at_risk" in lines


def test_cli_help_documents_the_queue_options(tmp_path: Path) -> None:
    from andante.cli.main import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    for option in ("--state-dir", "--queue", "--batch-max-in-flight", "--queue-claim-idle"):
        assert option in text
