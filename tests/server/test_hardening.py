"""Regression tests of issue #16's server defects: each fails without its fix."""

from __future__ import annotations

import dataclasses
import http.client
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from andante.runtime.local import LocalInstance
from andante.server import Backend, ServerThread, build_backend
from andante.server.admission import Admission
from andante.server.config import HTTPLimits
from andante.server.protocol import CompletionRequest
from andante.server.toy import ByteTokenizer
from tests.server.helpers import toy_options, toy_server, wait_for

JSON = {"Content-Type": "application/json"}


def _raw(srv: ServerThread, data: bytes, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection((srv.host, srv.port), timeout=timeout)
    sock.sendall(data)
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    """What the server sends until `marker` arrives or it closes the connection."""
    reply = b""
    while marker not in reply and (chunk := sock.recv(65536)):
        reply += chunk
    return reply


def test_accepted_connections_send_without_nagle_delay() -> None:
    with toy_server() as srv:
        conn = http.client.HTTPConnection(srv.host, srv.port)
        conn.request("GET", "/v1/models")
        conn.getresponse().read()  # the connection stays open (kept alive)
        uv = srv._server  # noqa: SLF001 - the server's side of the connection
        socks = [p.transport.get_extra_info("socket") for p in uv.server_state.connections]
        flags = [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in socks
                 if s.fileno() != -1]
        conn.close()
    assert flags and all(flags)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_413_naming_it(chunked: bool) -> None:
    body = b'{"prompt": "%s"}' % (b"x" * 2000)
    content: Any = iter([body[:1000], body[1000:]]) if chunked else body
    with toy_server(limits=HTTPLimits(max_body_bytes=1000)) as srv:
        r = httpx.post(srv.url + "/v1/completions", content=content, headers=JSON)
        assert r.status_code == 413, r.text
        assert "1000" in r.json()["error"]["message"]
        assert "--max-body-bytes" in r.json()["error"]["message"]
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200


class ThreadRecordingTokenizer(ByteTokenizer):
    """Notes the thread of every tokenisation."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict[str, str]],
                            add_generation_prompt: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().apply_chat_template(messages, add_generation_prompt)


def test_prompts_are_tokenised_off_the_event_loop() -> None:
    tokenizer = ThreadRecordingTokenizer()
    options = toy_options()
    backend = dataclasses.replace(build_backend(options), tokenizer=tokenizer)
    with ServerThread(options, backend) as srv:
        assert httpx.post(srv.url + "/v1/completions",
                          json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(srv.url + "/v1/chat/completions", json=chat).status_code == 200
    assert len(tokenizer.threads) >= 2
    assert all(name.startswith("andante-prepare") for name in tokenizer.threads)


@pytest.mark.parametrize("key", ["sesame", "café"])
def test_any_api_key_failure_is_a_json_401(key: str) -> None:
    with toy_server(api_key=key) as srv:
        for sent in ("Bearer café".encode(), "Bearer naïve".encode("latin-1"), b"Basic x"):
            r = httpx.get(srv.url + "/v1/models", headers={"Authorization": sent})
            if sent == f"Bearer {key}".encode():
                assert r.status_code == 200
                continue
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "invalid_api_key"
        good = httpx.get(srv.url + "/v1/models",
                         headers={"Authorization": f"Bearer {key}".encode()})
        assert good.status_code == 200


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def server_logs() -> Iterator[_Records]:
    handler = _Records()
    loggers = [logging.getLogger(n) for n in ("andante.server", "uvicorn.error")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    yield handler
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_a_client_gone_mid_upload_is_one_log_line(server: ServerThread,
                                                  server_logs: _Records) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    _raw(server, head + b'{"prompt": "').close()

    def gone() -> list[logging.LogRecord]:
        return [r for r in server_logs.records if "went away" in r.getMessage()]

    wait_for(lambda: bool(gone()))
    assert len(gone()) == 1
    assert not any(r.exc_info for r in server_logs.records)


def test_a_tiny_temperature_is_greedy() -> None:
    admission = Admission(build_backend(toy_options()))
    body = CompletionRequest(prompt="hi", temperature=1e-39)
    req = admission.admit(body, [1, 2], 4, "r", 0.0)
    assert req.sampling.is_greedy


def test_a_busy_port_fails_before_loading_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "andante.cli.main", "serve", "--model",
             "/nonexistent/model.gguf", "--port", str(port)],
            capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"andante serve: cannot listen on 127.0.0.1:{port}: Address already in use"]


def _dies_on_third_step(backend: Backend, index: int) -> None:
    inst = backend.runner.instances[index]
    assert isinstance(inst, LocalInstance)
    executor = inst.worker.engine.executor
    real = executor.execute
    calls = [0]

    def execute(batch: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("boom")
        return real(batch)

    executor.execute = execute  # type: ignore[method-assign]


def test_the_server_fails_streams_and_exits_when_its_engine_dies() -> None:
    options = toy_options(toy_step_time=0.05)
    backend = build_backend(options)
    _dies_on_third_step(backend, 0)
    srv = ServerThread(options, backend).start()
    try:
        body = {"prompt": "hi", "max_tokens": 50, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert any('"code":"error"' in e for e in events), events
        wait_for(lambda: not srv.is_running, timeout=15)
        assert srv.exit_status == 1
    finally:
        srv.stop()


def test_one_dead_instance_of_two_leaves_the_server_serving() -> None:
    options = dataclasses.replace(toy_options(toy_step_time=0.02), instances=2)
    backend = build_backend(options)
    _dies_on_third_step(backend, 0)
    with ServerThread(options, backend) as srv:
        body = {"prompt": "hi", "max_tokens": 20}
        replies = [httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
                   for _ in range(2)]  # round-robin: one on each instance
        wait_for(lambda: not backend.runner.instances[0].alive)
        assert sorted(r.status_code for r in replies) == [200, 500]
        again = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
        assert again.status_code == 200
        assert srv.is_running and srv.exit_status == 0


def test_slow_headers_and_bodies_time_out() -> None:
    limits = HTTPLimits(header_timeout=0.3, body_timeout=0.3)
    with toy_server(limits=limits) as srv:
        sock = _raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\n")
        reply = _read_until(sock, b"--header-timeout")
        assert reply.startswith(b"HTTP/1.1 408") and b"--header-timeout" in reply
        assert sock.recv(65536) == b""  # and closed
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 100\r\n\r\n")
        sock = _raw(srv, head + b'{"prompt": ')
        reply = _read_until(sock, b"--body-timeout")
        assert reply.startswith(b"HTTP/1.1 408") and b"--body-timeout" in reply
        assert httpx.get(srv.url + "/health").status_code == 200


CLOSED = ("/", "/metrics", "/api/stats", "/openapi.json", "/v1/models")


@pytest.mark.parametrize("public", [False, True])
def test_an_api_key_closes_everything_but_health(public: bool) -> None:
    with toy_server(api_key="k", limits=HTTPLimits(public_metrics=public)) as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        for path in CLOSED:
            r = httpx.get(srv.url + path)
            open_ = public and path != "/v1/models"
            assert r.status_code == (200 if open_ else 401), path
            if not open_:
                assert r.json()["error"]["code"] == "invalid_api_key"
            ok = httpx.get(srv.url + path, headers={"Authorization": "Bearer k"})
            assert ok.status_code == 200


@pytest.mark.parametrize("kind", [None, "text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x"])
def test_a_post_must_be_json(server: ServerThread, kind: str | None) -> None:
    headers = {} if kind is None else {"Content-Type": kind}
    r = httpx.post(server.url + "/v1/completions", headers=headers,
                   content=b'{"prompt": "hi", "max_tokens": 2}')
    assert r.status_code == 415
    assert "application/json" in r.json()["error"]["message"]
