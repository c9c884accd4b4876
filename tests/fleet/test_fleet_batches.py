"""The durable batch queue feeding upstreams: a batch through the fleet completes on
upstream servers, spread over them, with the batch's deadline and a low priority; a
429 from an upstream runs the item again."""

from __future__ import annotations

from tests.fleet.helpers import FakeUpstream, fake_upstream, fleet_server, toy_upstreams
from tests.server.batch_helpers import batch_lines, finished, output_lines, submit, wait_batch


def test_a_batch_runs_on_the_upstreams() -> None:
    with toy_upstreams(2, 2.0) as ups, fleet_server([u.url for u in ups]) as fleet:
        batch = submit(fleet.url, batch_lines(12, max_tokens=20), window="1h")
        done = wait_batch(fleet.url, batch["id"], finished, timeout=60)
        lines = output_lines(fleet.url, done["output_file_id"])
        received = [u.num_received for u in fleet.fleet.upstreams]
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(12))
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert all(line["response"]["body"]["usage"]["completion_tokens"] == 20 for line in lines)
    assert sum(received) == 12 and min(received) >= 1  # the feeder ran several at once


def test_batch_items_carry_deadline_and_priority_and_survive_a_refusal() -> None:
    fake = FakeUpstream(models=[{"id": "fake", "owned_by": "andante"}], statuses=[429] * 3)
    with fake_upstream(fake) as url, fleet_server([url], max_attempts=1) as fleet:
        lines = [{**line, "body": {**line["body"], "model": "fake"}}
                 for line in batch_lines(2)]
        batch = submit(fleet.url, lines, window="1h")
        done = wait_batch(fleet.url, batch["id"], finished, timeout=60)
    assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert len(fake.bodies) == 5  # three refusals, each run again by the feeder
    for body in fake.bodies:
        assert body["priority"] >= 100
        assert 3500 < body["slo"]["deadline"] <= 3600
