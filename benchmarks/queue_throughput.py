"""Durable queue throughput: enqueue, claim (dequeue) and complete (outcome + ack) per
second, for the SQLite store and the Redis Streams store.

    .venv/bin/python benchmarks/queue_throughput.py --items 20000 --rounds 3

Enqueue: batches of `--batch-size` items, each batch one `create_batch` (one
transaction / one MULTI). Claim: `claim(limit=--claim)` until empty. Complete: one
`complete` per item (outcome written, then acknowledged: one SQLite transaction / one
Lua script), as the server does. Redis: `--redis redis://HOST:PORT`, else a
`redis-server` from PATH on a free port of 127.0.0.1 (no persistence, stopped at the
end); skipped when neither exists. The target (issue 17): never the bottleneck at
1,000 requests/s, i.e. every rate well above 1,000/s.

Prints ONE JSON line: per store the median rate of each operation over the rounds, and
the load average of each round (the machine is shared: read the figures with it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from andante.runtime.durable import open_store
from andante.runtime.durable.records import (
    DONE_OK,
    IN_PROGRESS,
    BatchRecord,
    Outcome,
    RequestCounts,
    WorkItem,
)
from andante.runtime.durable.store import DurableStore

BODY = json.dumps({"messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 16})
RESULT = json.dumps({"response": {"status_code": 200, "body": {"text": "x" * 400}}})


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def one_round(store: DurableStore, items: int, batch_size: int, claim: int, tag: str
              ) -> dict[str, float]:
    t0 = time.perf_counter()
    for start in range(0, items, batch_size):
        batch_id = f"batch_{tag}_{start}"
        n = min(batch_size, items - start)
        batch = BatchRecord(batch_id, "file", "/v1/chat/completions", "24h", 0, 86400,
                            counts=RequestCounts(total=n))
        batch.enter(IN_PROGRESS, 0)
        store.create_batch(batch, [WorkItem(batch_id, f"r{i}", i + 1, "/v1/chat/completions",
                                            BODY, f"model-{tag}") for i in range(n)])
    t1 = time.perf_counter()
    claimed: list[WorkItem] = []
    while got := store.claim([f"model-{tag}"], claim):
        claimed += got
    t2 = time.perf_counter()
    for item in claimed:
        store.complete(item, Outcome(item.custom_id, item.line, DONE_OK, RESULT))
    t3 = time.perf_counter()
    assert len(claimed) == items, (len(claimed), items)
    return {"enqueue_per_s": _rate(items, t1 - t0), "claim_per_s": _rate(items, t2 - t1),
            "complete_per_s": _rate(items, t3 - t2),
            "end_to_end_per_s": _rate(items, t3 - t0)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def local_redis() -> Iterator[str | None]:
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def measure(make: Callable[[], DurableStore], args: argparse.Namespace, name: str
            ) -> dict[str, Any]:
    rounds: list[dict[str, float]] = []
    loads: list[float] = []
    store = make()
    try:
        for r in range(args.rounds):
            loads.append(_loadavg())
            rounds.append(one_round(store, args.items, args.batch_size, args.claim, f"{name}{r}"))
    finally:
        store.close()
    medians = {key: round(statistics.median(r[key] for r in rounds)) for key in rounds[0]}
    return {**medians, "rounds": [{k: round(v) for k, v in r.items()} for r in rounds],
            "loadavg": loads}


def _loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=1000, help="items per batch")
    parser.add_argument("--claim", type=int, default=16, help="items per claim call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis", help="redis://HOST:PORT (default: a local redis-server)")
    args = parser.parse_args()
    out: dict[str, Any] = {"benchmark": "queue_throughput", "items": args.items,
                           "batch_size": args.batch_size, "claim": args.claim}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = measure(lambda: open_store("sqlite", tmp), args, "sqlite")
    with local_redis() as started:
        url = args.redis or started
        if url is None:
            out["redis"] = "skipped: no redis-server on PATH and no --redis"
        else:
            out["redis"] = measure(lambda: open_store(url, consumer="bench"), args, "redis")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
