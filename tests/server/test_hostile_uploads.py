"""Issue #26, items 4, 7, 10 and 13: uploads, the Files API, and the batch store's own
failures. Each test fails with its fix reverted."""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
import tracemalloc

import httpx
import pytest

from andante.server import ServerThread
from andante.server.config import HTTPLimits
from tests.server.batch_helpers import batch_lines, jsonl, submit, upload, wait_batch
from tests.server.helpers import toy_server, wait_for


def _service(srv: ServerThread):  # noqa: ANN202 - the app's BatchService
    return srv._app.state.batches  # noqa: SLF001


def test_uploads_beyond_the_cap_get_a_429() -> None:
    head = (b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
            b"boundary=b\r\nContent-Length: 100000\r\n\r\n--b\r\n")
    with toy_server(limits=HTTPLimits(max_uploads=1)) as srv:
        held = socket.create_connection((srv.host, srv.port))
        held.sendall(head)  # an upload in progress
        wait_for(lambda: _upload_slots_taken(srv) == 1)
        second = upload(srv.url, jsonl(batch_lines(2)))
        assert second.status_code == 429, second.text
        assert "--max-uploads" in second.json()["error"]["message"]
        held.close()
        wait_for(lambda: _upload_slots_taken(srv) == 0)
        assert upload(srv.url, jsonl(batch_lines(2))).status_code == 200


def _upload_slots_taken(srv: ServerThread) -> int:
    return int(srv._app.state.uploads.num_active)  # noqa: SLF001


def test_an_upload_is_never_whole_in_memory() -> None:
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": "p" * 1000}})
    content = "".join(line.replace('"x"', f'"r{i}"', 1) + "\n" for i in range(16_000)).encode()
    form = httpx.Request("POST", "http://x/", files={"file": ("in.jsonl", content)},
                         data={"purpose": "batch"})
    body, kind = form.read(), form.headers["content-type"]
    with toy_server() as srv:
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
        tracemalloc.start()  # the server's allocations (the body is built already)
        try:
            conn.request("POST", "/v1/files", body=body, headers={"Content-Type": kind})
            reply = conn.getresponse()
            record = json.loads(reply.read())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            conn.close()
        assert reply.status == 200, record
        assert len(content) > 16e6 and peak < 8e6, peak  # the body was 16 MB
        stored = _service(srv).file_content(record["id"])
        assert stored == content


def test_an_oversize_chunked_upload_names_max_file_bytes() -> None:
    body = b"--b\r\n" + b"x" * 5000
    with toy_server(limits=HTTPLimits(max_file_bytes=1000)) as srv:
        r = httpx.post(srv.url + "/v1/files", content=iter([body[:2500], body[2500:]]),
                       headers={"Content-Type": "multipart/form-data; boundary=b"})
        assert r.status_code == 413
        assert "--max-file-bytes" in r.json()["error"]["message"]


@pytest.mark.parametrize("body", ['{"prompt": "x", "max_tokens": 1' + "0" * 5000 + "}",
                                  '{"prompt": ' + "[" * 1000 + "]" * 1000 + "}"])
def test_a_monstrous_batch_line_is_a_json_400(server: ServerThread, body: str) -> None:
    line = '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": ' + body + "}\n"
    r = upload(server.url, line.encode())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json_line"


def test_a_huge_completion_window_is_a_json_400(server: ServerThread) -> None:
    file_id = upload(server.url, jsonl(batch_lines(1))).json()["id"]
    r = httpx.post(server.url + "/v1/batches", json={
        "input_file_id": file_id, "endpoint": "/v1/completions",
        "completion_window": "9223372036854775807s"})
    assert r.status_code == 400 and "completion_window" in r.json()["error"]["message"]


def test_an_unexpected_failure_is_a_json_500(server: ServerThread) -> None:
    service = _service(server)
    real = service.page

    def broken(*args: object) -> object:
        raise RuntimeError("boom")

    service.page = broken
    try:
        r = httpx.get(server.url + "/v1/batches")
    finally:
        service.page = real
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"


class _FullDisk:
    """A SQLite connection whose disk is full: every INSERT fails as SQLite says so."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, *args: object) -> object:
        if sql.lstrip().upper().startswith("INSERT"):
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.db, name)


def test_a_full_store_fails_the_batch_with_a_reason() -> None:
    with toy_server(toy_step_time=0.05) as srv:  # 20 steps: time to fill the disk
        store = _service(srv).store
        batch = submit(srv.url, batch_lines(4, max_tokens=20))
        with store._lock:  # noqa: SLF001
            store._db = _FullDisk(store._db)  # noqa: SLF001
        done = wait_batch(srv.url, batch["id"], lambda b: b["status"] != "in_progress")
        assert done["status"] == "failed"
        assert done["errors"]["data"][0]["code"] == "store_full"
        assert "full" in done["errors"]["data"][0]["message"]
        r = upload(srv.url, jsonl(batch_lines(1)))
        assert r.status_code == 507 and r.json()["error"]["code"] == "store_full"
        with store._lock:  # noqa: SLF001
            store._db = store._db.db  # noqa: SLF001


def test_files_can_be_listed_deleted_and_expire(server: ServerThread) -> None:
    first = upload(server.url, jsonl(batch_lines(1))).json()
    second = httpx.post(f"{server.url}/v1/files", files={"file": ("b.jsonl",
                        jsonl(batch_lines(1)))}, data={"purpose": "batch",
                        "expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"})
    assert second.status_code == 200, second.text
    assert second.json()["expires_at"] == second.json()["created_at"] + 3600
    listed = httpx.get(server.url + "/v1/files").json()
    ids = [f["id"] for f in listed["data"]]
    assert ids[:2] == [second.json()["id"], first["id"]]
    r = httpx.delete(f"{server.url}/v1/files/{first['id']}")
    assert r.status_code == 200 and r.json() == {"id": first["id"], "object": "file",
                                                 "deleted": True}
    assert httpx.get(f"{server.url}/v1/files/{first['id']}").status_code == 404
    feeder = _service(server).feeder
    real_wall = feeder.wall
    feeder.wall = lambda: real_wall() + 3601
    try:
        feeder.delete_expired_files()
    finally:
        feeder.wall = real_wall
    assert httpx.get(f"{server.url}/v1/files/{second.json()['id']}").status_code == 404


def test_the_openai_client_lists_and_deletes_files(server: ServerThread) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    created = client.files.create(file=("in.jsonl", jsonl(batch_lines(1))), purpose="batch")
    assert created.id in [f.id for f in client.files.list()]
    assert client.files.delete(created.id).deleted
    client.batches.cancel  # noqa: B018 - the bare cancel is tested in test_hostile_bodies


def test_expiry_is_a_default_retention() -> None:
    with toy_server() as srv:
        record = upload(srv.url, jsonl(batch_lines(1))).json()
        assert record["expires_at"] == record["created_at"] + 30 * 86400
