"""Issue #26, items 6 and 12: the batch store failing under a running server (Redis
losing its data, Redis down) and /metrics staying bounded. Each test fails with its fix
reverted."""

from __future__ import annotations

import dataclasses
import subprocess
import time

import httpx

from andante.runtime.durable.records import BatchRecord
from andante.server import ServerThread
from andante.server.config import BatchOptions
from tests.runtime.redis_server import free_port, require_redis
from tests.server.batch_helpers import batch_lines, finished, submit, wait_batch
from tests.server.helpers import toy_options, toy_server, wait_for
from tests.server.test_hardening import _Records, server_logs  # noqa: F401 - a fixture


def _redis(binary: str, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    wait_for(lambda: _pings(client))
    return proc


def _pings(client: object) -> bool:
    try:
        return bool(client.ping())  # type: ignore[attr-defined]
    except Exception:
        return False


def test_redis_losing_its_data_or_going_down_is_survived(
        server_logs: _Records) -> None:  # noqa: F811
    import redis

    binary = require_redis()
    port = free_port()
    proc = _redis(binary, port)
    url = f"redis://127.0.0.1:{port}"
    options = dataclasses.replace(toy_options(), batch=BatchOptions(queue=url))
    try:
        with ServerThread(options) as srv:
            first = submit(srv.url, batch_lines(2))
            assert wait_batch(srv.url, first["id"], finished)["status"] == "completed"
            redis.Redis(port=port).flushall()  # Redis lost everything (no persistence)
            again = submit(srv.url, batch_lines(2))
            assert wait_batch(srv.url, again["id"], finished, timeout=20)["status"] == \
                "completed"

            proc.terminate()
            proc.wait(timeout=10)
            r = httpx.get(srv.url + "/v1/batches")
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
            metrics = httpx.get(srv.url + "/metrics")
            assert metrics.status_code == 200
            assert "andante:batch_store_up 0.0" in metrics.text
            assert "andante:num_requests_running" in metrics.text  # the engine's gauges
            time.sleep(1.5)  # the feeder ticks through the outage
            down = [r for r in server_logs.records if "store failed" in r.getMessage()]
            assert len(down) == 1 and not down[0].exc_info

            proc = _redis(binary, port)
            wait_for(lambda: any("store is back" in r.getMessage()
                                 for r in server_logs.records), timeout=10)
            last = submit(srv.url, batch_lines(2))
            assert wait_batch(srv.url, last["id"], finished)["status"] == "completed"
            assert len([r for r in server_logs.records if "store is back" in r.getMessage()]) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_metrics_stay_bounded_with_many_open_batches() -> None:
    with toy_server() as srv:
        feeder = srv._app.state.batches.feeder  # noqa: SLF001
        now = int(time.time())
        fake = [BatchRecord(f"batch_{i:05d}", "f", "/v1/completions", "24h", now, now + 1000 + i)
                for i in range(1, 2001)]
        feeder._sweep = lambda: None  # noqa: SLF001 - keep the fake open batches
        feeder.open = fake
        text = httpx.get(srv.url + "/metrics").text
    series = [line for line in text.splitlines() if line.startswith(
        "andante:batch_deadline_slack_seconds{")]
    assert len(series) == 10
    assert 'batch_id="batch_00001"' in text  # the worst (least slack) is there
    assert "andante:batches_at_risk 0.0" in text
    assert 'andante:batch_slack_seconds_bucket{le="+Inf"} 2000.0' in text
    assert len(text) < 50_000


def test_the_readme_names_the_redis_persistence_the_guarantee_needs() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "appendonly yes" in readme




def test_with_a_keys_file_each_tenant_sees_only_its_own(tmp_path: object) -> None:
    """Issue #26 item 11."""
    from pathlib import Path

    from andante.server.config import read_keys_file
    from tests.server.batch_helpers import jsonl, upload

    keys = Path(str(tmp_path)) / "keys"
    keys.write_text("# tenants\nalice ka\nbob kb\n")
    options = dataclasses.replace(toy_options(), api_keys=read_keys_file(str(keys)))
    alice, bob = ({"Authorization": f"Bearer {k}"} for k in ("ka", "kb"))
    with ServerThread(options) as srv:
        file_id = httpx.post(srv.url + "/v1/files", headers=alice, data={"purpose": "batch"},
                             files={"file": ("a.jsonl", jsonl(batch_lines(1)))}).json()["id"]
        batch = httpx.post(srv.url + "/v1/batches", headers=alice, json={
            "input_file_id": file_id, "endpoint": "/v1/completions"}).json()
        assert httpx.get(f"{srv.url}/v1/files/{file_id}", headers=alice).status_code == 200
        assert httpx.get(f"{srv.url}/v1/files/{file_id}", headers=bob).status_code == 404
        assert httpx.get(f"{srv.url}/v1/batches/{batch['id']}", headers=bob).status_code == 404
        assert httpx.post(srv.url + "/v1/batches", headers=bob, json={
            "input_file_id": file_id, "endpoint": "/v1/completions"}).status_code == 404
        assert httpx.get(srv.url + "/v1/batches", headers=bob).json()["data"] == []
        assert httpx.get(srv.url + "/v1/files", headers=bob).json()["data"] == []
        listed = httpx.get(srv.url + "/v1/batches", headers=alice).json()["data"]
        assert [b["id"] for b in listed] == [batch["id"]]
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert upload(srv.url, jsonl(batch_lines(1))).status_code == 401
