"""Batch input files (per-line errors) and multipart form parsing."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.server.batches.input import (
    MAX_REPORTED,
    BatchInputError,
    check_for_batch,
    parse_batch_file,
)
from andante.server.batches.multipart import parse_form
from tests.server.batch_helpers import batch_lines, jsonl


def test_a_good_file_parses_and_skips_blank_lines() -> None:
    lines = parse_batch_file(jsonl(batch_lines(3)) + b"\n  \n")
    assert [(x.line, x.custom_id, x.url) for x in lines] == [
        (1, "req-0", "/v1/completions"), (2, "req-1", "/v1/completions"),
        (3, "req-2", "/v1/completions")]


def test_every_bad_line_is_reported_with_its_number_and_code() -> None:
    good = json.dumps(batch_lines(1)[0])
    content = "\n".join([good, "[1]", good, '{"custom_id": "", "method": "POST"}',
                         json.dumps({**batch_lines(1)[0], "custom_id": "x", "extra": 1})])
    with pytest.raises(BatchInputError) as info:
        parse_batch_file(content.encode())
    codes = [(e.line, e.code) for e in info.value.errors]
    assert codes == [(2, "invalid_request"), (3, "duplicate_custom_id"),
                     (4, "invalid_custom_id"), (5, "invalid_request")]
    assert "line 3: custom_id 'req-0' is a duplicate of line 1's" in str(info.value)


def test_many_errors_are_capped_in_the_message() -> None:
    with pytest.raises(BatchInputError) as info:
        parse_batch_file(b"x\n" * 50)
    assert len(info.value.errors) == MAX_REPORTED and info.value.total == 50
    assert "(and 40 more)" in str(info.value)


def test_checks_against_the_batch() -> None:
    lines = parse_batch_file(jsonl(batch_lines(2) + batch_lines(1, "/v1/chat/completions",
                                                                prefix="c")))
    errors = check_for_batch(lines, "/v1/completions", ["toy"])
    assert [(e.line, e.code, e.param) for e in errors] == [(3, "mismatched_endpoint", "url")]
    assert errors[0].to_api()["line"] == 3


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_fail_cleanly(content: bytes) -> None:
    try:
        lines = parse_batch_file(content)
    except BatchInputError as exc:
        assert exc.errors and all(e.line >= 1 for e in exc.errors)
    else:
        assert len({x.custom_id for x in lines}) == len(lines)


def _encoded(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=fields, files=files)
    return request.read(), request.headers["content-type"]


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=2000), st.text(min_size=1, max_size=20).filter(
    lambda s: "\r" not in s and "\n" not in s and '"' not in s and "\\" not in s))
def test_multipart_round_trip(content: bytes, purpose: str) -> None:
    body, kind = _encoded({"purpose": purpose}, {"file": ("in.jsonl", content)})
    form = parse_form(body, kind)
    file = form["file"]
    assert body[file.start:file.end] == content and file.filename == "in.jsonl"
    assert form["purpose"].text(body) == purpose and form["purpose"].filename is None


def test_a_form_of_many_parts_is_refused_at_the_cap() -> None:
    part = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\ny\r\n'
    body = part * 400_000 + b"--b--\r\n"
    with pytest.raises(ValueError, match="at most 16 parts"):
        parse_form(body, "multipart/form-data; boundary=b")


@pytest.mark.parametrize(("body", "kind", "needle"), [
    (b"abc", "application/json", "multipart/form-data"),
    (b"abc", "multipart/form-data", "no boundary"),
    (b"--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nx", "multipart/form-data; "
     "boundary=b", "truncated"),
    (b"--b\r\nX: y\r\n\r\nx\r\n--b--\r\n", "multipart/form-data; boundary=b", "name"),
])
def test_malformed_multipart_is_a_value_error(body: bytes, kind: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_form(body, kind)
