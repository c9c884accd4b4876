from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from andante.workload.traces import load_trace, parse_timestamp_ns


def test_parse_timestamp_seven_digit_fraction() -> None:
    base = parse_timestamp_ns("2023-11-16 18:15:46")
    assert parse_timestamp_ns("2023-11-16 18:15:46.6805900") - base == 680_590_000
    assert parse_timestamp_ns("2023-11-16T18:15:46.5") - base == 500_000_000
    assert parse_timestamp_ns("2023-11-16 18:15:46.123456789123") - base == 123_456_789
    assert parse_timestamp_ns("2023-11-16 18:15:46Z") == base
    assert parse_timestamp_ns("2023-11-16 19:15:46+01:00") == base
    assert parse_timestamp_ns("12.5") == 12_500_000_000
    with pytest.raises(ValueError, match="unparseable timestamp 'yesterday'"):
        parse_timestamp_ns("yesterday")
    with pytest.raises(ValueError, match="unparseable timestamp"):
        parse_timestamp_ns("2023-13-16 18:15:46")


def test_real_conversation_trace(conv_trace: Path) -> None:
    trace = load_trace(conv_trace)
    assert len(trace) == 19_366
    assert trace.arrival_times[0] == 0.0
    assert trace.arrival_times[1] == pytest.approx(4.995169 - 0.68059, abs=1e-9)
    assert np.all(np.diff(trace.arrival_times) >= 0)
    assert len(trace) / trace.span == pytest.approx(5.53, rel=0.01)  # README's mean rate
    assert trace.prompt_lens.mean() == pytest.approx(1155, rel=0.01)
    assert trace.output_lens.mean() == pytest.approx(211, rel=0.01)


def test_rate_scale_halves_the_span(conv_trace: Path) -> None:
    base = load_trace(conv_trace)
    fast = load_trace(conv_trace, rate_scale=2.0)
    assert fast.span == pytest.approx(base.span / 2)
    np.testing.assert_array_equal(fast.prompt_lens, base.prompt_lens)


def test_cuts(conv_trace: Path) -> None:
    first_minute = load_trace(conv_trace, max_duration=60.0)
    assert first_minute.arrival_times[-1] <= 60.0 and len(first_minute) > 100
    scaled = load_trace(conv_trace, rate_scale=2.0, max_duration=60.0)
    assert len(scaled) > len(first_minute)  # the cut applies to the scaled timeline
    assert len(load_trace(conv_trace, max_requests=10, max_duration=60.0)) == 10


def test_unsorted_rows_are_sorted(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:02.0000000,20,2\n"
        "2023-11-16 18:00:01.5000000,10,1\n"
        "2023-11-16 18:00:04.0000000,40,0\n"
    )
    trace = load_trace(path)
    assert trace.arrival_times.tolist() == [0.0, 0.5, 2.5]
    assert trace.prompt_lens.tolist() == [10, 20, 40]
    assert trace.output_lens.tolist() == [1, 2, 1]  # 0 generated tokens is raised to 1


def test_bad_traces(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"absent\.csv: no such file"):
        load_trace(tmp_path / "absent.csv")
    path = tmp_path / "cols.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:00:02,20\n")
    with pytest.raises(ValueError, match=r"cols\.csv: columns \['ContextTokens', 'TIMESTAMP'\] "
                       "match no known trace format"):
        load_trace(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nnoon,20,2\n")
    with pytest.raises(ValueError, match=r"cols\.csv: column TIMESTAMP, data row 1"):
        load_trace(path)
    with pytest.raises(ValueError, match="rate_scale"):
        load_trace(path, rate_scale=0.0)
