"""/metrics: the prefix cache's queries and hits (vLLM's counters, in tokens)."""

from __future__ import annotations

import httpx

from andante.server.metrics import PREFIX
from tests.server.helpers import toy_server

LABEL = '{model_name="toy"}'
PROMPT = "The same long system prompt, repeated for every request. " * 3


def _counter(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(PREFIX + name + LABEL):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def _complete(url: str, prompt: str) -> None:
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200


def test_a_repeated_prompt_counts_hits() -> None:
    with toy_server() as server:
        _complete(server.url, PROMPT)
        queries = _counter(server.url, "prefix_cache_queries_total")
        assert queries > 16 and _counter(server.url, "prefix_cache_hits_total") == 0
        _complete(server.url, PROMPT)
        assert _counter(server.url, "prefix_cache_queries_total") == 2 * queries
        hits = _counter(server.url, "prefix_cache_hits_total")
        assert hits == (queries - 1) // 16 * 16  # all full blocks but the last token's


def test_switched_off_nothing_is_queried() -> None:
    with toy_server(enable_prefix_caching=False) as server:
        _complete(server.url, PROMPT)
        _complete(server.url, PROMPT)
        assert _counter(server.url, "prefix_cache_queries_total") == 0
        assert _counter(server.url, "prefix_cache_hits_total") == 0
