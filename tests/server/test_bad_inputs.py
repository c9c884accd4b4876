"""Every bad request gets the right 4xx with an OpenAI-style error, and the server stays
healthy."""

from __future__ import annotations

import httpx
import pytest

from andante.server import ServerThread

TOO_LONG = "x" * 5000  # the toy context is 4096 tokens (one per byte)

CASES = [
    # (path, raw body, status, param)
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 3', 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "3"}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": "hot"}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": 42}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "stream": "yes"}', 400, "stream"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 3, "bogus": 1}', 400, "bogus"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -1}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100000000}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "model": "gpt-9"}', 404, "model"),
    ("/v1/completions", b'{"prompt": ""}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": []}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": [1, 99999]}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": ["a", "b"]}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "%s"}' % TOO_LONG.encode(), 400, "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "n": 2}', 400, "n"),
    ("/v1/completions", b'{"prompt": "hi", "top_p": 0}', 400, "top_p"),
    ("/v1/completions", b'{"prompt": "hi", "presence_penalty": 2.5}', 400, "presence_penalty"),
    ("/v1/completions", b'{"prompt": "hi", "repetition_penalty": 0}', 400,
     "repetition_penalty"),
    ("/v1/completions", b'{"prompt": "hi", "min_p": 1.5}', 400, "min_p"),
    ("/v1/completions", b'{"prompt": "hi", "min_tokens": -1}', 400, "min_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4, "min_tokens": 5}', 400,
     "min_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "slo": {"ttft": -1}}', 400, "slo.ttft"),
    ("/v1/completions", b'{"prompt": "hi", "slo": {"tds": "fast"}}', 400, "slo.tds"),
    ("/v1/completions", b'{"prompt": "hi", "slo": {"latency": 1}}', 400, "slo.latency"),
    ("/v1/completions", b'{"prompt": "hi", "priority": 1.5}', 400, "priority"),
    ("/v1/completions", b'{"prompt": "hi", "stream_options": {"x": true}}', 400,
     "stream_options.x"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["%s"]}' % (b"z" * 1025), 400, "stop"),
    ("/v1/completions", b'{"prompt": "hi", "seed": %d}' % (1 << 64), 400, "seed"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', 400, "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', 400,
     "messages.0.role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": ""}]}', 400,
     "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
     b'"max_completion_tokens": -5}', 400, "max_completion_tokens"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
def test_bad_request(server: ServerThread, path: str, body: bytes, status: int,
                     param: str | None) -> None:
    r = httpx.post(server.url + path, content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["message"]
    if param:
        assert param.split(".")[0] in error["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_server_still_serves_after_bad_requests(server: ServerThread) -> None:
    for path, body, _, _ in CASES:
        httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"})
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "ok", "max_tokens": 4})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 4
    snap = server.state.runner.stats
    assert snap.num_free_blocks == snap.num_blocks


def test_prompt_larger_than_kv_cache_is_refused() -> None:
    from tests.server.helpers import toy_server

    with toy_server(num_kv_blocks=4, block_size=16) as srv:  # 64 tokens of KV
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "y" * 100, "max_tokens": 1})
        assert r.status_code == 400
        assert "KV cache" in r.json()["error"]["message"]
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "y" * 10, "max_tokens": 60})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "y" * 10, "max_tokens": 50})
        assert r.status_code == 200


def test_unknown_route_is_a_json_404(server: ServerThread) -> None:
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404
    assert "error" in r.json()
