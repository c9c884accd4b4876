"""Percentiles, run summaries, their dict form and the side-by-side table."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from andante.core import SLO
from andante.metrics import (
    RequestRecord,
    Summary,
    format_table,
    itls,
    percentiles,
    pooled_itls,
    qoe_of,
    summarize,
)
from andante.metrics import summary as summary_module
from andante.metrics.sketch import ITL_RELATIVE_ERROR, LogHistogram
from andante.metrics.summary import SummaryStream
from tests.metrics.reference import MakeRecord


def test_percentiles_match_numpy_linear() -> None:
    values = np.random.default_rng(0).exponential(2.0, size=101).tolist() + [7.0]
    s = percentiles(values)
    assert s.count == len(values)
    assert s.mean == pytest.approx(np.mean(values))
    assert s.std == pytest.approx(np.std(values))
    assert s.median == pytest.approx(np.percentile(values, 50))
    assert s.p90 == pytest.approx(np.percentile(values, 90))
    assert s.p99 == pytest.approx(np.percentile(values, 99))
    assert s.p10 == pytest.approx(np.percentile(values, 10))
    assert (s.min, s.max) == (min(values), max(values))
    small = percentiles([1.0, 2.0, 3.0, 4.0])  # linear: p90 = 3.7, p99 = 3.97
    assert (small.median, small.p90, small.p99) == pytest.approx((2.5, 3.7, 3.97))


def test_percentiles_empty() -> None:
    s = percentiles([])
    assert s.count == 0 and math.isnan(s.mean) and math.isnan(s.p99)


@pytest.fixture
def run(make_record: MakeRecord) -> list[RequestRecord]:
    return [
        make_record(arrival=0.0, times=[0.5, 0.7, 0.9], num_prompt_tokens=100),
        make_record(arrival=1.0, times=[1.2, 1.3], num_prompt_tokens=50, num_preemptions=2),
        make_record(arrival=2.0, times=[2.1], finish_reason="abort", num_prompt_tokens=10),
        make_record(arrival=3.0, times=[], finish_reason=None, num_prompt_tokens=20),
    ]


def test_summarize_counts_and_rates(run: list[RequestRecord]) -> None:
    s = summarize(run)
    assert (s.num_requests, s.num_finished, s.num_aborted, s.num_unfinished) == (4, 2, 1, 1)
    assert s.duration == pytest.approx(2.1)  # last token 2.1 - first arrival 0.0
    assert s.total_input_tokens == 150 and s.total_output_tokens == 5  # completed only
    assert s.request_throughput == pytest.approx(2 / 2.1)
    assert s.output_throughput == pytest.approx(5 / 2.1)
    assert s.ttft.count == 2 and s.ttft.mean == pytest.approx((0.5 + 0.2) / 2)
    assert s.tpot.mean == pytest.approx((0.2 + 0.1) / 2)
    assert s.e2el.max == pytest.approx(0.9)
    assert s.mean_preemptions == pytest.approx(0.5)


def test_itl_is_pooled_over_completed_requests(make_record: MakeRecord) -> None:
    records = [
        make_record(times=[]),
        make_record(times=[0.1, 0.4, 0.5]),
        make_record(times=[1.0]),
        make_record(times=[2.0, 2.25]),
        make_record(times=[]),
    ]
    expected = [gap for r in records for gap in itls(r)]
    assert pooled_itls(records).tolist() == pytest.approx(expected)
    assert summarize(records).itl.count == 3


def test_in_flight_qoe_is_judged_at_now(run: list[RequestRecord]) -> None:
    s = summarize(run, duration=10.0)  # now defaults to first arrival + duration
    expected = [qoe_of(r, now=10.0) for r in run]
    assert s.qoe.mean == pytest.approx(np.mean(expected))
    assert expected[3] == 0.0  # queued since t = 3, far past its TTFT target
    early = summarize(run, duration=10.0, now=3.5)
    assert early.qoe.min > 0.0  # at t = 3.5 the queued request is still within target


def test_qoe_attainment_and_slo_attainment(make_record: MakeRecord) -> None:
    slo = SLO(ttft=1.0, tds=1.0)
    records = [
        make_record(times=[1.0, 2.0, 3.0], slo=slo),  # perfect
        make_record(times=[5.0, 6.0, 7.0], slo=slo),  # late start
    ]
    s = summarize(records)
    assert s.qoe.max == 1.0 and s.qoe.min < 0.95
    assert s.qoe_attainment == 0.5
    assert s.slo_attainment == 0.5


def test_to_dict_is_flat_json_in_ms(run: list[RequestRecord]) -> None:
    d = summarize(run, goodput_thresholds={"ttft": 0.3}).to_dict()
    for key in (
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p90_itl_ms",
        "mean_e2el_ms",
        "mean_qoe",
        "p10_qoe",
        "request_goodput",
        "slo_attainment",
        "request_throughput",
        "output_throughput",
        "total_output_tokens",
    ):
        assert key in d, key
    assert d["mean_ttft_ms"] == pytest.approx(350.0)
    assert d["request_goodput"] == pytest.approx(1 / 2.1)  # only the 0.2 s TTFT request
    json.dumps(d, allow_nan=False)
    empty = summarize([]).to_dict()
    assert empty["mean_ttft_ms"] is None and empty["num_requests"] == 0
    json.dumps(empty, allow_nan=False)


def test_format_table_side_by_side(run: list[RequestRecord]) -> None:
    summaries: dict[str, Summary] = {"vllm": summarize(run), "andes": summarize(run[:2])}
    table = format_table(summaries)
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "vllm", "andes"]
    assert any(line.startswith("TTFT mean (ms)") for line in lines)
    row = next(line for line in lines if line.startswith("requests"))
    assert row.split()[-2:] == ["4", "2"]
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule are aligned


def test_log_histogram_percentiles_within_the_stated_error() -> None:
    values = np.random.default_rng(5).lognormal(-3.0, 1.5, 20_000)
    values[:50] = 0.0
    hist = LogHistogram()
    for part in np.array_split(values, 7):
        hist.add(part)
    qs = (0.0, 10.0, 50.0, 90.0, 99.0, 100.0)
    exact = np.percentile(values, qs)
    assert hist.count == len(values)
    for got, want in zip(hist.quantiles(qs), exact, strict=True):
        assert abs(got - want) <= ITL_RELATIVE_ERROR * want


def test_streamed_itls_fold_in_bounded_batches(
    make_record: MakeRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folding buffered gaps every few tokens gives the histogram of adding them record by
    record, the exact count/min/max and the mean/std up to float rounding."""
    monkeypatch.setattr(summary_module, "ITL_FOLD_TOKENS", 7)
    rng = np.random.default_rng(3)
    records = [
        make_record(arrival=float(i), times=(i + np.cumsum(rng.exponential(0.03, n))).tolist())
        for i, n in enumerate(rng.integers(0, 12, 200))
    ]
    stream = SummaryStream()
    one_by_one = LogHistogram()
    for record in records:
        stream.add(record)
        assert stream._itl_tokens < 7  # the buffer never outgrows its bound
        if len(record.token_times) > 1:
            one_by_one.add(np.diff(np.asarray(record.token_times)))
    streamed, exact = stream.summary().itl, summarize(records).itl
    np.testing.assert_array_equal(stream._itl_histogram._counts, one_by_one._counts)
    assert stream._itl_histogram.num_zeros == one_by_one.num_zeros
    assert (streamed.count, streamed.min, streamed.max) == (exact.count, exact.min, exact.max)
    assert streamed.mean == pytest.approx(exact.mean, rel=1e-12)
    assert streamed.std == pytest.approx(exact.std, rel=1e-12)
    assert streamed.p99 == pytest.approx(exact.p99, rel=ITL_RELATIVE_ERROR)
