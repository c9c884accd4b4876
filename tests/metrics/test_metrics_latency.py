"""ttft / tpot / itl / e2el on hand-made timelines, and RequestRecord construction."""

from __future__ import annotations

import pytest

from andante.core import SLO, Request, RequestStatus, SamplingParams
from andante.metrics import RequestRecord, e2el, itls, tpot, ttft
from tests.metrics.reference import MakeRecord


def test_latencies_of_a_stream(make_record: MakeRecord) -> None:
    rec = make_record(arrival=10.0, times=[10.5, 10.7, 11.0, 11.6])
    assert ttft(rec) == pytest.approx(0.5)
    assert e2el(rec) == pytest.approx(1.6)
    assert tpot(rec) == pytest.approx((1.6 - 0.5) / 3)
    assert itls(rec) == pytest.approx([0.2, 0.3, 0.6])


def test_single_token_has_no_tpot(make_record: MakeRecord) -> None:
    rec = make_record(arrival=1.0, times=[1.25])
    assert ttft(rec) == pytest.approx(0.25)
    assert e2el(rec) == pytest.approx(0.25)
    assert tpot(rec) is None
    assert itls(rec) == []


def test_no_tokens(make_record: MakeRecord) -> None:
    rec = make_record(arrival=1.0, times=[], finish_reason=None)
    assert ttft(rec) is None and e2el(rec) is None and tpot(rec) is None
    assert itls(rec) == []


def test_record_validation(make_record: MakeRecord) -> None:
    with pytest.raises(ValueError, match="precedes arrival"):
        make_record(arrival=5.0, times=[4.0])
    with pytest.raises(ValueError, match="max_tokens"):
        make_record(times=[1.0, 2.0], max_tokens=1)
    rec = RequestRecord("x", 0.0, [1.0, 2.0])  # type: ignore[arg-type]
    assert rec.token_times == (1.0, 2.0)


def test_finish_states(make_record: MakeRecord) -> None:
    assert make_record(finish_reason="stop").is_completed
    assert make_record(finish_reason="length").is_completed
    aborted = make_record(finish_reason="abort")
    assert aborted.is_finished and aborted.is_aborted and not aborted.is_completed
    running = make_record(finish_reason=None)
    assert not running.is_finished and not running.is_aborted


def test_from_request() -> None:
    slo = SLO(ttft=1.0, tds=5.0)
    req = Request("a", [1, 2, 3], SamplingParams(max_tokens=8), arrival_time=2.0, slo=slo)
    req.start_running(2.1)
    req.append_output_token(7, 2.5)
    req.preempt_by_recompute(2.6)
    req.start_running(2.8)
    req.append_output_token(8, 3.0)
    req.finish(RequestStatus.FINISHED_STOPPED, 3.0)
    rec = RequestRecord.from_request(req)
    assert rec.request_id == "a"
    assert rec.arrival_time == 2.0
    assert rec.token_times == (2.5, 3.0)
    assert rec.num_prompt_tokens == 3
    assert rec.slo == slo
    assert rec.finish_reason == "stop"
    assert rec.num_preemptions == 1
    assert rec.max_tokens == 8
    req.append_output_token(9, 4.0)  # the record is a snapshot
    assert rec.num_output_tokens == 2
