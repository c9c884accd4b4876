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


HOST = """cpu  400 0 0 1600 0 0 0 0 0 0
cpu0 100 0 0 400 0 0 0 0 0 0
cpu1 100 0 0 400 0 0 0 0 0 0
cpu2 200 0 0 300 0 0 0 0 0 0
cpu3 0 0 0 500 0 0 0 0 0 0
"""


def test_only_the_allowed_cpus_count() -> None:
    assert parse_proc_stat(HOST, 100.0, frozenset({2, 3})) == (2.0, 10.0)
    assert parse_proc_stat(HOST, 100.0, frozenset({0})) == (1.0, 5.0)
    everything = parse_proc_stat(HOST, 100.0)  # all allowed: the aggregate line as is
    assert parse_proc_stat(HOST, 100.0, frozenset(range(8))) == everything == (4.0, 20.0)
    with pytest.raises(ValueError, match="cpu"):
        parse_proc_stat(HOST, 100.0, frozenset({9}))


def test_a_neighbour_on_our_cores_of_a_large_host_is_half_our_capacity() -> None:
    """Two allowed cores of 64: a neighbour busy on one of them over a second."""
    def host(busy_on_1: int, idle: int) -> str:
        rest = "".join(f"cpu{n} 0 0 0 {idle} 0 0 0 0 0 0\n" for n in range(2, 64))
        return (f"cpu  {busy_on_1} 0 0 {63 * idle + (idle - busy_on_1)} 0 0 0 0 0 0\n"
                f"cpu0 0 0 0 {idle} 0 0 0 0 0 0\n"
                f"cpu1 {busy_on_1} 0 0 {idle - busy_on_1} 0 0 0 0 0 0\n{rest}")
    texts = iter([host(0, 1000), host(100, 1100)])
    times = [read_cpu_times(lambda: next(texts), lambda: frozenset({0, 1}))
             for _ in range(2)]
    assert times[0] is not None and times[1] is not None
    assert others_share(times[0], times[1]) == pytest.approx(0.5, abs=0.01)


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
