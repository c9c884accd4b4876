"""/metrics: vLLM's metrics under `andante:` plus a QoE histogram; /api/stats; /health."""

from __future__ import annotations

import httpx

from andante.server import ServerThread
from andante.server.metrics import PREFIX

EXPECTED = [
    "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
    "e2e_request_latency_seconds_count", "request_queue_time_seconds_count",
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
    "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
    "request_qoe_bucket", "request_success_total",
]


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_after_requests(server: ServerThread) -> None:
    before = _samples(httpx.get(server.url + "/metrics").text)
    for _ in range(3):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "abcd", "max_tokens": 6})
        assert r.status_code == 200
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in EXPECTED:
        assert PREFIX + name in r.text, name
    after = _samples(r.text)
    label = '{model_name="toy"}'

    def grew(name: str) -> float:
        key = PREFIX + name + label
        return after[key] - before.get(key, 0.0)

    assert grew("time_to_first_token_seconds_count") == 3
    assert grew("e2e_request_latency_seconds_count") == 3
    assert grew("inter_token_latency_seconds_count") == 3 * 5
    assert grew("generation_tokens_total") == 18
    assert grew("prompt_tokens_total") == 12
    assert grew("request_qoe_count") == 3
    assert after[PREFIX + "num_requests_running" + label] == 0
    assert 0 <= after[PREFIX + "kv_cache_usage_perc" + label] <= 1


def test_two_servers_have_separate_registries() -> None:
    from tests.server.helpers import toy_server

    with toy_server() as a, toy_server() as b:
        httpx.post(a.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        count = PREFIX + 'time_to_first_token_seconds_count{model_name="toy"}'
        assert _samples(httpx.get(a.url + "/metrics").text)[count] == 1
        assert _samples(httpx.get(b.url + "/metrics").text)[count] == 0


def test_stats_health_and_page(server: ServerThread) -> None:
    httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
    stats = httpx.get(server.url + "/api/stats").json()
    assert stats["model"] == "toy" and stats["policy"] == "vllm"
    assert {"num_running", "num_waiting", "kv_usage"} <= set(stats["engine"])
    assert stats["recent"] and 0 <= stats["recent"][-1]["qoe"] <= 1
    assert httpx.get(server.url + "/health").status_code == 200
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "<canvas" in page.text
    assert "://" not in page.text  # no CDN: the page works offline
