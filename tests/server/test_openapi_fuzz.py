"""Fuzz the OpenAPI schema (schemathesis): no generated request, valid or not, may get
a 5xx. Bounded: a fixed number of examples per operation, on a toy server with a short
context so that no accepted request runs long."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from andante.server import ServerThread  # noqa: E402
from tests.server.helpers import toy_server  # noqa: E402

EXAMPLES_PER_OPERATION = 100


@pytest.fixture(scope="module")
def fuzzed_server() -> Iterator[ServerThread]:
    with toy_server(max_model_len=64, toy_step_time=0.0005) as srv:
        yield srv


def _operations(url: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.slow  # every operation (completions, chat, files, batches...) x 100 examples x 2 modes
@pytest.mark.timeout(300)
def test_no_request_gets_a_server_error(fuzzed_server: ServerThread) -> None:
    operations = _operations(fuzzed_server.url)
    paths = {op.path for op in operations}
    assert {"/v1/completions", "/v1/chat/completions", "/health"} <= paths
    for operation in operations:
        _fuzz(operation, fuzzed_server)


def _fuzz(operation: Any, srv: ServerThread) -> None:
    """Valid requests, then (for bodies) invalid ones (schemathesis' negative mode)."""
    modes = [GenerationMode.POSITIVE]
    if operation.method.lower() == "post":
        modes.append(GenerationMode.NEGATIVE)
    for mode in modes:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            case.call_and_validate(base_url=srv.url, checks=[not_a_server_error], timeout=10)

        check()
        assert srv.state.runner.is_alive


# ---- oversized lists and deep nesting (issue 26) -----------------------------------
from hypothesis import strategies as st  # noqa: E402

BASE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/v1/batches": {"input_file_id": "file-x", "endpoint": "/v1/completions"},
}
FIELDS = ("prompt", "messages", "stop", "stop_token_ids", "metadata", "input_file_id",
          "slo", "content", "max_tokens")
ELEMENTS = ("1", '"x"', "{}", "[]", "null", '{"role": "user", "content": "x"}',
            '{"type": "text", "text": "x"}', "[1, 2]")


def _big_list(element: str, size: int) -> str:
    return "[" + ",".join([element] * size) + "]"


def _deep(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


hostile_values = st.one_of(
    st.builds(_big_list, st.sampled_from(ELEMENTS), st.integers(5, 300_000)),
    st.builds(_deep, st.integers(50, 5000), st.sampled_from(["list", "dict"])),
)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(sorted(BASE_BODIES)), field=st.sampled_from(FIELDS),
       value=hostile_values)
def test_oversized_lists_and_deep_nesting_get_a_json_4xx(
        fuzzed_server: ServerThread, path: str, field: str, value: str) -> None:
    import httpx

    body = dict(BASE_BODIES[path])
    body.pop(field, None)
    text = json.dumps(body)[:-1] + (", " if body else "") + f'"{field}": {value}}}'
    reply = httpx.post(fuzzed_server.url + path, content=text.encode(), timeout=30,
                       headers={"Content-Type": "application/json"})
    assert reply.status_code < 500, reply.text[:300]
    if reply.status_code >= 400:
        assert "error" in reply.json()
    assert fuzzed_server.state.runner.is_alive
