"""andante.perf.frontend_log: the front end's time around the engine, fitted from a step
log's request records (the engine's side) and http records (the HTTP timing
middleware's); old logs without them give 0 and say so; malformed ones are refused."""

from __future__ import annotations

import json

import pytest

from andante.perf.frontend_log import (
    FrontendLogError,
    fit_frontend,
    parse_frontend,
)


def _lines(*records: dict) -> list[str]:
    return [json.dumps(r) + "\n" for r in records]


def _request(rid: str, arrival: float, seen: float, first: float | None, **extra) -> dict:
    return {"kind": "request", "id": rid, "arrival": arrival, "seen": seen,
            "first_token": first, **extra}


def _http(rid: str, received: float, first_byte: float | None) -> dict:
    return {"kind": "http", "id": rid, "received": received, "first_byte": first_byte}


def test_matched_sides_give_the_mean_time_before_and_after_the_engine():
    lines = _lines(
        {"kind": "step", "duration": 0.01, "num_tokens": 1},
        _request("cmpl-a-0-1f2e3d4c", 100.020, 100.030, 100.200),  # vLLM's suffixes
        _http("cmpl-a", 100.000, 100.260),
        _request("cmpl-b-0-99aa88bb", 101.015, 101.020, 101.500),
        _http("cmpl-b", 101.000, 101.540),
        _request("cmpl-c-0-00000000", 102.0, 102.01, None),  # no token yet: before only
        _http("cmpl-unmatched", 103.0, 103.1))
    fit = fit_frontend(*parse_frontend(lines))
    assert fit.num_requests == 3 and fit.num_matched == 2 and fit.note is None
    assert fit.frontend_in == pytest.approx((0.030 + 0.020) / 2)
    assert fit.frontend_out == pytest.approx((0.060 + 0.040) / 2)


def test_andante_trace_times_are_moved_onto_the_wall_clock_by_their_origin():
    lines = _lines(_request("cmpl-x", 2.0, 2.004, 2.100, origin=1000.0),
                   _http("cmpl-x", 1001.990, 1002.130))
    fit = fit_frontend(*parse_frontend(lines))
    assert fit.frontend_in == pytest.approx(0.014)
    assert fit.frontend_out == pytest.approx(0.030)


def test_request_records_alone_give_the_engines_own_wait_and_say_so():
    lines = _lines(_request("a", 10.0, 10.050, 10.3), _request("b", 11.0, 11.030, 11.2))
    fit = fit_frontend(*parse_frontend(lines))
    assert fit.frontend_in == pytest.approx(0.040) and fit.frontend_out == 0.0
    assert fit.note is not None and "assumed to take 0 s" in fit.note


def test_a_log_without_request_records_assumes_no_front_end_and_says_so():
    fit = fit_frontend(*parse_frontend(_lines({"kind": "step", "duration": 0.01,
                                               "num_tokens": 1})))
    assert (fit.frontend_in, fit.frontend_out, fit.num_requests) == (0.0, 0.0, 0)
    assert fit.note is not None and "no request records" in fit.note


def test_a_request_refused_before_the_engine_saw_it_is_skipped():
    refused = {"kind": "request", "id": "r", "arrival": 1.0, "seen": None,
               "first_token": None}
    assert fit_frontend(*parse_frontend(_lines(refused))).num_requests == 0


@pytest.mark.parametrize("record, message", [
    (_request("a", "soon", 1.0, 1.1), "'arrival' as a number"),
    ({"kind": "request", "id": "a", "arrival": 1.0, "first_token": 1.2}, "needs 'seen'"),
    (_request("a", 2.0, 1.0, 2.1), "arrival to seen runs backwards"),
    (_request("a", 1.0, 1.1, 1.0), "seen to first_token runs backwards"),
    (_request("", 1.0, 1.1, 1.2), "request 'id'"),
    (_http("a", 1.0, 0.5), "received to first_byte runs backwards"),
    ({"kind": "http", "id": "a", "first_byte": 1.0}, "'received' as a number"),
    ({"kind": "http", "id": "a", "received": float("nan"), "first_byte": 1.0},
     "'received' as a number"),
])
def test_a_malformed_record_is_refused_naming_its_line(record, message):
    lines = _lines({"kind": "step", "duration": 0.01, "num_tokens": 1}, record)
    with pytest.raises(FrontendLogError, match=f"line 2: .*{message}"):
        fit_frontend(*parse_frontend(lines))


def test_sides_that_contradict_each_other_are_refused():
    lines = _lines(_request("a", 1.0, 1.01, 1.2), _http("a", 1.5, 1.6))
    with pytest.raises(FrontendLogError, match=r"received to seen \(http line 2\) runs backwards"):
        fit_frontend(*parse_frontend(lines))


def test_the_time_before_the_engine_counts_only_requests_that_found_it_idle():
    lines = _lines(_request("a", 1.0, 1.010, 1.2, idle=True), _http("a", 0.995, 1.21),
                   _request("b", 2.0, 2.900, 3.1, idle=False), _http("b", 1.995, 3.11))
    fit = fit_frontend(*parse_frontend(lines))
    assert fit.frontend_in == pytest.approx(0.015)  # b waited for a step to end
    assert fit.frontend_out == pytest.approx(0.010) and fit.note is None
    busy = _lines(_request("b", 2.0, 2.900, 3.1, idle=False), _http("b", 1.995, 3.11))
    fit = fit_frontend(*parse_frontend(busy))
    assert fit.frontend_in == pytest.approx(0.905)
    assert fit.note is not None and "no request found the engine idle" in fit.note
    with pytest.raises(FrontendLogError, match="'idle' must be true, false or null"):
        parse_frontend(_lines(_request("c", 1.0, 1.1, 1.2, idle="yes")))
