"""Others' CPU share from /proc/stat (andante.exec.cpu_share)."""

from __future__ import annotations

import pytest

from andante.exec.cpu_share import (
    CpuTimes,
    measure_others_share,
    others_share,
    parse_proc_stat,
    read_cpu_times,
)

STAT = """cpu  100 10 50 800 20 5 5 10 7 0
cpu0 50 5 25 400 10 2 3 5 3 0
intr 12345
"""


def test_proc_stat_busy_and_total() -> None:
    busy, total = parse_proc_stat(STAT, 100.0)
    assert busy == pytest.approx((100 + 10 + 50 + 5 + 5 + 10) / 100)  # guest is in user
    assert total == pytest.approx((180 + 800 + 20) / 100)


def test_proc_stat_without_the_aggregate_line_is_an_error() -> None:
    with pytest.raises(ValueError, match="cpu"):
        parse_proc_stat("intr 1\n", 100.0)


def test_others_share_subtracts_our_own_time() -> None:
    before = CpuTimes(busy=10.0, total=100.0, own=2.0)
    assert others_share(before, CpuTimes(busy=12.0, total=102.0, own=4.0)) == 0.0
    assert others_share(before, CpuTimes(busy=12.0, total=102.0, own=3.0)) == 0.5
    assert others_share(before, CpuTimes(busy=20.0, total=102.0, own=2.0)) == 1.0  # clamped
    assert others_share(before, before) == 0.0


def test_measure_runs_between_two_readings() -> None:
    readings = iter([CpuTimes(0.0, 0.0, 0.0), CpuTimes(1.5, 2.0, 0.5)])
    result, share = measure_others_share(lambda: "done", lambda: next(readings))
    assert (result, share) == ("done", 0.5)
    assert measure_others_share(lambda: 1, lambda: None) == (1, None)


def test_this_machine_reads() -> None:
    times = read_cpu_times()
    if times is not None:  # Linux
        assert 0 <= times.busy <= times.total and times.own >= 0
