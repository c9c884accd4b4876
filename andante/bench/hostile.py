"""Hostile clients: the attacks of issue #26 against a running server, and a watch of its
well-behaved clients meanwhile.

Each attack is a function of the server's URL that returns its own figures (the status
it got, how long the server took to refuse, how long it held a trickling connection,
capped at `HOLD_CAP_S`); `run_attack(url, name, copies)` runs `copies` of it at once on
threads; `attacks_in_subprocess(url)` runs every attack alone and then four at once in
a process of its own (`python -m andante.bench.hostile all URL`: its interpreter lock
is not the watcher's; lowest CPU priority, as if the attackers were elsewhere), one
JSON line per attack. `Watch` runs `num_streams` streaming completions and a `/health` probe
every 50 ms on its own thread and event loop, and reports the longest pause of any
stream (between two of its chunks, or from its request to its first chunk) and the
slowest `/health`. `rss_bytes(pid)` reads a process's resident memory.

Used by `tests/server/test_hostile_clients.py` (every attack while 20 streams run) and
`benchmarks/hostile_clients.py` (each probe's figures, before and after the fixes).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

HOLD_CAP_S = 8.0  # a trickling connection held this long counts as held forever
TRICKLE_CONNECTIONS = 25  # per copy of a slowloris attack
COPIES = (1, 4)  # each attack alone, then four at once
AFTERMATH_S = 1.0
JSON = {"Content-Type": "application/json"}
Figures = dict[str, Any]


# ---- raw connections --------------------------------------------------------------
def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _trickle(url: str, head: bytes, cap_s: float = HOLD_CAP_S) -> tuple[bytes, float]:
    """Send `head`, then a byte every 0.1 s while reading, until the server closes the
    connection or `cap_s` passes: what the server sent, and how long it held on."""
    start = time.monotonic()
    reply = b""
    with socket.create_connection(_address(url), timeout=5) as sock:
        sock.sendall(head)
        sock.settimeout(0.1)
        while time.monotonic() - start < cap_s:
            try:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
                continue
            except TimeoutError:
                pass
            except OSError:
                break
            try:
                sock.sendall(b"x")
            except OSError:
                break
    return reply, time.monotonic() - start


def _trickling(url: str, head: bytes) -> Figures:
    """`TRICKLE_CONNECTIONS` trickling connections at once: the longest held, the replies."""
    with ThreadPoolExecutor(TRICKLE_CONNECTIONS) as pool:
        results = list(pool.map(lambda _: _trickle(url, head), range(TRICKLE_CONNECTIONS)))
    statuses = sorted({r.split(b"\r\n", 1)[0].decode("latin-1")[9:12] or "none"
                       for r, _ in results})
    return {"connections": len(results), "held_max_s": round(max(h for _, h in results), 2),
            "statuses": statuses}


def _timed_post(url: str, path: str, **kwargs: Any) -> Figures:
    start = time.monotonic()
    try:
        reply = httpx.post(url + path, timeout=120, **kwargs)
    except httpx.HTTPError as exc:
        return {"error": type(exc).__name__, "seconds": round(time.monotonic() - start, 3)}
    return {"status": reply.status_code, "seconds": round(time.monotonic() - start, 3),
            "json": reply.headers.get("content-type", "").startswith("application/json")}


# ---- the attacks ------------------------------------------------------------------
def huge_list(url: str) -> Figures:
    """A 2.6 MB body of 1.3M list items (issue item 1)."""
    body = b'{"messages":[' + b",".join([b"1"] * 1_300_000) + b"]}"
    return _timed_post(url, "/v1/chat/completions", content=body, headers=JSON)


def stop_token_ids(url: str) -> Figures:
    body = b'{"prompt":"hi","max_tokens":1,"stop_token_ids":[' + b",".join(
        [b"1"] * 450_000) + b"]}"
    return _timed_post(url, "/v1/completions", content=body, headers=JSON)


def long_prompt(url: str) -> Figures:
    """A 3.9 MB prompt (item 2): refused before it is tokenized."""
    body = json.dumps({"prompt": "ab " * 1_300_000, "max_tokens": 1}).encode()
    return _timed_post(url, "/v1/completions", content=body, headers=JSON)


def slow_headers(url: str) -> Figures:
    return _trickling(url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")


def slow_body(url: str) -> Figures:
    """Item 3: a body that trickles (the server answers 408, then must close)."""
    return _trickling(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: 100000\r\n\r\n{")


def unread_body(url: str) -> Figures:
    """Item 3: `GET /health` announcing a gigabyte it never sends."""
    return _trickling(url, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      b"1000000000\r\n\r\n")


def slow_upload(url: str) -> Figures:
    return _trickling(url, b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/"
                      b"form-data; boundary=b\r\nContent-Length: 1000000\r\n\r\n--b\r\n")


def _batch_file(num_lines: int, prompt_chars: int = 16) -> bytes:
    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST",
                               "url": "/v1/completions",
                               "body": {"prompt": "p" * prompt_chars, "max_tokens": 1}}) + "\n"
                   for i in range(num_lines)).encode()


def big_upload(url: str) -> Figures:
    """Item 4: a 20 MB batch file."""
    content = _batch_file(20_000, prompt_chars=900)
    return _timed_post(url, "/v1/files", files={"file": ("big.jsonl", content)},
                       data={"purpose": "batch"})


def many_parts(url: str) -> Figures:
    """Item 5: a form of 150k parts."""
    part = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\ny\r\n'
    body = part * 150_000 + b"--b--\r\n"
    return _timed_post(url, "/v1/files", content=body,
                       headers={"Content-Type": "multipart/form-data; boundary=b"})


def big_batch(url: str) -> Figures:
    """Item 5: a batch of 10k lines created (then cancelled)."""
    uploaded = httpx.post(url + "/v1/files", files={"file": ("b.jsonl", _batch_file(10_000))},
                          data={"purpose": "batch"}, timeout=120)
    if uploaded.status_code != 200:
        return {"upload_status": uploaded.status_code}
    figures = _timed_post(url, "/v1/batches", json={
        "input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions"})
    batches = httpx.get(url + "/v1/batches", timeout=30).json().get("data", [])
    for batch in batches:
        if batch.get("status") == "in_progress":
            httpx.post(f"{url}/v1/batches/{batch['id']}/cancel", json={}, timeout=30)
    return figures


def bad_batch_input(url: str) -> Figures:
    """Item 7: lines with a 5,000-digit number and 1,000-deep nesting; a window of 2^63 s."""
    figures: Figures = {}
    for name, body in (("digits", '{"prompt": "x", "max_tokens": 1' + "0" * 5000 + "}"),
                       ("nesting", '{"prompt": ' + "[" * 1000 + "]" * 1000 + "}")):
        line = '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": '
        figures[name] = _timed_post(url, "/v1/files", data={"purpose": "batch"},
                                    files={"file": ("x.jsonl", (line + body + "}\n").encode())})
    ok = httpx.post(url + "/v1/files", files={"file": ("ok.jsonl", _batch_file(1))},
                    data={"purpose": "batch"}, timeout=30)
    if ok.status_code == 200:
        figures["window"] = _timed_post(url, "/v1/batches", json={
            "input_file_id": ok.json()["id"], "endpoint": "/v1/completions",
            "completion_window": "9223372036854775807s"})
    return figures


def huge_id(url: str) -> Figures:
    """Item 13: an unknown 100 KB file id."""
    start = time.monotonic()
    reply = httpx.post(url + "/v1/batches", json={"input_file_id": "f" * 100_000,
                                                  "endpoint": "/v1/completions"}, timeout=30)
    return {"status": reply.status_code, "reply_bytes": len(reply.content),
            "seconds": round(time.monotonic() - start, 3)}


ATTACKS: dict[str, Callable[[str], Figures]] = {fn.__name__: fn for fn in (
    huge_list, stop_token_ids, long_prompt, slow_headers, slow_body, unread_body,
    slow_upload, big_upload, many_parts, big_batch, bad_batch_input, huge_id)}


def run_attack(url: str, name: str, copies: int = 1) -> list[Figures]:
    """`copies` of the attack at once (threads); each copy's figures."""
    attack = ATTACKS[name]
    with ThreadPoolExecutor(copies) as pool:
        return list(pool.map(lambda _: _safely(attack, url), range(copies)))


def _safely(attack: Callable[[str], Figures], url: str) -> Figures:
    try:
        return attack(url)
    except (OSError, httpx.HTTPError) as exc:  # the server went away: a figure too
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def run_all(url: str, names: Sequence[str] = tuple(ATTACKS),
            copies: Sequence[int] = COPIES) -> Iterator[Figures]:
    """Each attack with each number of copies in turn, then `AFTERMATH_S` of nothing (what
    an attack leaves running counts against it): `{attack, copies, figures}`."""
    for name in names:
        for n in copies:
            figures = run_attack(url, name, n)
            time.sleep(AFTERMATH_S)
            yield {"attack": name, "copies": n, "figures": figures}


def attacks_in_subprocess(url: str, env: dict[str, str] | None = None,
                          only: tuple[str, int] | None = None) -> Iterator[Figures]:
    """`run_all` (or `only` one attack with that many copies) in a separate process (its
    own interpreter lock) at the lowest CPU priority, as if the attackers were elsewhere
    (a 2-core machine runs both): each attack's `{attack, copies, figures}` as soon as it
    has ended."""
    which = ["all"] if only is None else ["one", only[0], str(only[1])]
    proc = subprocess.Popen([sys.executable, "-m", "andante.bench.hostile", *which, url],
                            stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: os.nice(19))  # noqa: PLW1509
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            yield json.loads(line)
    finally:
        proc.stdout.close()
        if proc.wait(timeout=60) != 0:
            raise RuntimeError(f"the attacks failed (exit status {proc.returncode})")


@contextmanager
def toy_server_process(*args: str, env: dict[str, str] | None = None,
                       cwd: str | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`andante serve --model toy --port 0 ARGS` in its own process (its memory and its
    interpreter lock its own; `cwd`: the source tree to run, as `python -m` puts the
    working directory first on the path): its URL and process, stopped by PID."""
    proc = subprocess.Popen([sys.executable, "-m", "andante.cli.main", "serve", "--model",
                             "toy", "--port", "0", "--log-level", "warning", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=cwd)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if match is None:
            raise RuntimeError(f"the server did not start: {line!r}")
        yield f"http://127.0.0.1:{match.group(1)}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for process {pid}")


# ---- the well-behaved clients ------------------------------------------------------
@dataclass(slots=True)
class WatchReport:
    max_stream_pause_s: float = 0.0
    max_health_s: float = 0.0
    num_chunks: int = 0
    num_streams_done: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> Figures:
        return {"max_stream_pause_s": round(self.max_stream_pause_s, 3),
                "max_health_s": round(self.max_health_s, 3), "num_chunks": self.num_chunks,
                "num_streams_done": self.num_streams_done, "errors": self.errors[:5]}


class Watch:
    """`num_streams` streams and a `/health` probe, on a thread of their own, until
    `stop`; `reset` starts a new report (after a warm-up, say)."""

    def __init__(self, url: str, num_streams: int = 20, max_tokens: int = 400) -> None:
        self.url = url
        self.num_streams = num_streams
        self.max_tokens = max_tokens
        self.report = WatchReport()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()),
                                        name="hostile-watch", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def reset(self) -> WatchReport:
        report, self.report = self.report, WatchReport()
        return report

    def stop(self) -> WatchReport:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.report

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.num_streams + 4)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            tasks = [asyncio.create_task(self._stream(client)) for _ in range(self.num_streams)]
            tasks.append(asyncio.create_task(self._health(client)))
            await asyncio.gather(*tasks)

    async def _stream(self, client: httpx.AsyncClient) -> None:
        body = {"prompt": "hi", "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream": True}
        while not self._stop.is_set():
            try:
                last = time.monotonic()
                async with client.stream("POST", self.url + "/v1/completions",
                                         json=body) as reply:
                    async for line in reply.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        now = time.monotonic()
                        self.report.max_stream_pause_s = max(self.report.max_stream_pause_s,
                                                             now - last)
                        self.report.num_chunks += 1
                        last = now
                        if self._stop.is_set():
                            return
                self.report.num_streams_done += 1
            except httpx.HTTPError as exc:
                self.report.errors.append(f"stream: {type(exc).__name__}")
                await asyncio.sleep(0.1)

    async def _health(self, client: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                reply = await client.get(self.url + "/health", timeout=10)
                if reply.status_code != 200:
                    self.report.errors.append(f"health: {reply.status_code}")
            except httpx.HTTPError as exc:
                self.report.errors.append(f"health: {type(exc).__name__}")
            self.report.max_health_s = max(self.report.max_health_s, time.monotonic() - start)
            await asyncio.sleep(0.05)


def main(argv: list[str]) -> int:
    """`all URL`: every attack, one JSON line each; `one NAME COPIES URL`: one attack."""
    one = argv[0] == "one"
    for result in run_all(argv[-1], [argv[1]] if one else tuple(ATTACKS),
                          [int(argv[2])] if one else COPIES):
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
