"""Per-request SLO checks and goodput semantics."""

from __future__ import annotations

import pytest

from andante.core import SLO
from andante.metrics import (
    is_good,
    meets_deadline,
    meets_slo,
    meets_tbt,
    meets_ttft,
    summarize,
)
from andante.metrics.slo import check_goodput_thresholds
from tests.metrics.reference import MakeRecord

# ttft 0.5, tpot 0.1, e2el 0.8
TIMES = [0.5, 0.6, 0.7, 0.8]


def test_each_objective(make_record: MakeRecord) -> None:
    ok = make_record(times=TIMES, slo=SLO(ttft=0.5, tbt=0.1 + 1e-9, deadline=0.8))
    assert meets_ttft(ok) and meets_tbt(ok) and meets_deadline(ok) and meets_slo(ok)
    late = make_record(times=TIMES, slo=SLO(ttft=0.4))
    assert not meets_ttft(late) and not meets_slo(late)
    slow = make_record(times=TIMES, slo=SLO(tbt=0.05))
    assert not meets_tbt(slow) and meets_ttft(slow)
    overdue = make_record(times=TIMES, slo=SLO(deadline=0.7))
    assert not meets_deadline(overdue)


def test_missing_objectives_and_tokens(make_record: MakeRecord) -> None:
    assert meets_slo(make_record(times=TIMES))  # no SLO: met
    assert meets_tbt(make_record(times=[0.5], slo=SLO(tbt=0.01)))  # no gap to violate
    assert not meets_ttft(make_record(times=[], finish_reason="abort", slo=SLO(ttft=9.0)))
    # a deadline needs the request to complete
    assert not meets_deadline(make_record(times=TIMES, finish_reason=None, slo=SLO(deadline=9)))
    assert not meets_deadline(make_record(times=TIMES, finish_reason="abort", slo=SLO(deadline=9)))


def test_is_good_vllm_semantics(make_record: MakeRecord) -> None:
    rec = make_record(times=TIMES)
    assert is_good(rec)
    assert is_good(rec, ttft=0.5, tpot=0.1 + 1e-9, e2el=0.8)
    assert not is_good(rec, ttft=0.49)
    assert not is_good(rec, tpot=0.09)
    assert not is_good(rec, e2el=0.79)
    assert is_good(make_record(times=[0.5]), tpot=1e-6)  # one token: tpot counts as 0
    assert not is_good(make_record(times=TIMES, finish_reason="abort"))
    assert not is_good(make_record(times=TIMES, finish_reason=None))
    assert not is_good(make_record(times=[], finish_reason="stop"))


def test_goodput_counting(make_record: MakeRecord) -> None:
    records = [
        make_record(arrival=0.0, times=[0.2, 0.3, 0.4], slo=SLO(ttft=0.5)),  # good
        make_record(arrival=0.0, times=[0.9, 1.0], slo=SLO(ttft=0.5)),  # TTFT missed
        make_record(arrival=1.0, times=[1.1, 1.9], slo=SLO(tbt=0.5)),  # tpot missed
        make_record(arrival=1.0, times=[1.1, 1.2, 2.0]),  # no SLO: good
        make_record(arrival=1.5, times=[1.6], finish_reason="abort"),  # aborted: never good
    ]
    own = summarize(records, duration=4.0)
    assert own.num_good == 2
    assert own.request_goodput == pytest.approx(2 / 4.0)
    assert own.slo_attainment == pytest.approx(3 / 5)  # the aborted one has no SLO
    by_flag = summarize(records, duration=4.0, goodput_thresholds={"ttft": 0.5, "tpot": 0.5})
    # (ttft, tpot): #1 (0.2, 0.1) good, #2 (0.9, -) no, #3 (0.1, 0.8) no, #4 (0.1, 0.5) good
    assert by_flag.num_good == 2
    assert by_flag.request_goodput == pytest.approx(0.5)
    assert summarize(records, duration=4.0, goodput_thresholds={"e2el": 0.95}).num_good == 2


def test_goodput_threshold_validation() -> None:
    assert check_goodput_thresholds({"ttft": 1, "e2el": 2.5}) == {"ttft": 1.0, "e2el": 2.5}
    with pytest.raises(ValueError, match="unknown goodput metric"):
        check_goodput_thresholds({"itl": 1.0})
    with pytest.raises(ValueError, match="must be > 0"):
        check_goodput_thresholds({"ttft": 0.0})
