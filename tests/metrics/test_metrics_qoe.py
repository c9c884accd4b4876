"""Andes QoE: the four cases of Fig. 5, pacing, and mid-flight values."""

from __future__ import annotations

import pytest

from andante.core import SLO
from andante.metrics import DEFAULT_TDS, DEFAULT_TTFT_TARGET, qoe, qoe_of, tpot, ttft
from tests.metrics.reference import MakeRecord, brute_qoe_at, consumption, paper_qoe

# Reader: 1 token/s, TTFT target 1 s, arrival 0 -> ideal times 1, 2, ..., 10.
TDS = 1.0
TARGET = 1.0
N = 10
IDEAL = [TARGET + i / TDS for i in range(N)]


def q(times: list[float], **kw: float | int | None) -> float:
    return qoe(0.0, times, TARGET, TDS, **kw)  # type: ignore[arg-type]


def test_fig5a_perfect() -> None:
    assert q(IDEAL) == 1.0
    assert q([0.5] * N) == 1.0  # early tokens cannot be read early: still perfect


def test_fig5b_late_first_token() -> None:
    times = [t + 3.0 for t in IDEAL]  # first token 3 s late, then on pace
    # S_delay = 10 * 3, S_whole = sum(13 - i for i in 1..10) = 75
    assert q(times) == pytest.approx(1 - 30 / 75)


def test_fig5c_slow_stream() -> None:
    times = [TARGET + 2.0 * i for i in range(N)]  # on time, then half the reading pace
    # S_delay = sum(i for i in 0..9) = 45, S_whole = sum(19 - i for i in 1..10) = 135
    assert q(times) == pytest.approx(1 - 45 / 135)


def test_fig5d_pause_hidden_from_ttft_and_tpot(make_record: MakeRecord) -> None:
    times = [1.0, 1.1, 1.2] + [8.0 + 0.1 * i for i in range(N - 3)]  # preempted mid-stream
    rec = make_record(times=times, slo=SLO(ttft=TARGET, tds=TDS))
    assert ttft(rec) is not None and ttft(rec) <= TARGET  # type: ignore[operator]
    assert tpot(rec) is not None and tpot(rec) <= 1.0 / TDS  # type: ignore[operator]
    assert times[-1] <= IDEAL[-1]  # even the last token arrives before its ideal time
    value = qoe_of(rec)
    assert 0.0 < value < 1.0
    assert value == pytest.approx(paper_qoe(0.0, times, TARGET, TDS))


def test_matches_paper_formula_on_long_streams() -> None:
    # exercises the vectorized path (>= 64 tokens) against eq. 1-3 taken literally
    times = [1.0 + 0.7 * i + (5.0 if i > 40 else 0.0) for i in range(200)]
    assert q(times) == pytest.approx(paper_qoe(0.0, times, TARGET, TDS), rel=1e-12)


def test_faster_than_reading_pace_does_not_help() -> None:
    late = 4.0
    on_pace = [late + i / TDS for i in range(N)]
    burst = [late] * N  # everything at once after the same late start
    assert q(burst) == pytest.approx(q(on_pace))
    assert q(burst) <= q(on_pace)
    assert q([0.1 * i + 1 for i in range(N)]) == 1.0  # early and fast: still exactly 1


def test_midflight_queued_request() -> None:
    assert q([], now=0.5) == 1.0  # before its TTFT target
    assert q([], now=TARGET) == 1.0
    assert q([], now=5.0) == 0.0  # still queued past its target
    assert q([], now=5.0, max_tokens=3) == 0.0


def test_midflight_running_request() -> None:
    times = [1.0, 2.0, 3.0]  # on pace so far, nothing after
    assert q(times, now=3.0) == 1.0
    # at t = 5 tokens 4 and 5 are due and missing: delays 1 + 0
    assert q(times, now=5.0) == pytest.approx(1 - 1.0 / (4 + 3 + 2 + 1 + 0))
    assert q(times, now=5.0) == pytest.approx(brute_qoe_at(0.0, times, TARGET, TDS, 5.0, 100))
    # a token stamped after `now` has not arrived yet
    assert q([*times, 7.0], now=5.0) == pytest.approx(q(times, now=5.0))


def test_finished_value_at_last_consumption_equals_final() -> None:
    for times in (IDEAL, [t + 3.0 for t in IDEAL], [1.0, 1.1, 1.2, 8.0, 8.1, 12.0]):
        last = consumption(times, TDS)[-1]
        final = q(times)
        assert q(times, now=last, max_tokens=len(times)) == pytest.approx(final)
        assert q(times, now=last + 100.0, max_tokens=len(times)) == pytest.approx(final)
        assert brute_qoe_at(0.0, times, TARGET, TDS, last, len(times)) == pytest.approx(final)


def test_record_midflight_at_last_token_equals_final(make_record: MakeRecord) -> None:
    times = [2.5, 3.5, 4.5, 7.0, 9.0]  # the reader has caught up when the last one lands
    assert consumption(times, TDS)[-1] == times[-1]
    slo = SLO(ttft=TARGET, tds=TDS)
    running = make_record(times=times, finish_reason=None, slo=slo, max_tokens=len(times))
    done = make_record(times=times, finish_reason="stop", slo=slo)
    assert qoe_of(running, now=times[-1]) == pytest.approx(qoe_of(done))
    assert qoe_of(done, now=times[-1]) == pytest.approx(qoe_of(done))
    assert qoe_of(done, now=1e9) == pytest.approx(qoe_of(done))


def test_qoe_of_defaults_and_errors(make_record: MakeRecord) -> None:
    times = [0.5 + i for i in range(5)]
    rec = make_record(times=times)
    expected = qoe(0.0, times, DEFAULT_TTFT_TARGET, DEFAULT_TDS)
    assert qoe_of(rec) == expected
    custom = make_record(times=times, slo=SLO(ttft=0.1, tds=2.0))
    assert qoe_of(custom) == qoe(0.0, times, 0.1, 2.0)
    with pytest.raises(ValueError, match="in flight"):
        qoe_of(make_record(finish_reason=None))
    assert qoe_of(make_record(times=[], finish_reason="rejected")) == 0.0
    with pytest.raises(ValueError, match="tds"):
        qoe(0.0, times, 1.0, 0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        qoe(0.0, times, 1.0, 1.0, now=3.0, max_tokens=2)


def test_final_normalizer_quirk_documented() -> None:
    # Andes eq. 2: delaying the last token of a badly late stream adds n * delta to
    # S_whole but only delta to S_delay, so the *final* QoE rises ...
    before, after = q([10.0, 10.0, 10.0]), q([10.0, 10.0, 20.0])
    assert before == pytest.approx(1 - 27 / 30)
    assert after > before
    # ... while at any fixed time the delayed stream is never better.
    assert q([10.0, 10.0, 20.0], now=15.0) <= q([10.0, 10.0, 10.0], now=15.0)
