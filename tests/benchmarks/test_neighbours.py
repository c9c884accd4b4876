"""benchmarks/neighbours.py: CPU-bound neighbours start when asked and are stopped."""

from __future__ import annotations

import time

import pytest

from tests.benchmarks.scripts import load_benchmark


def test_neighbours_start_at_their_moments_and_stop_with_the_run() -> None:
    neighbours = load_benchmark("neighbours")
    result, started = neighbours.Neighbours([0.0, 0.3, 60.0]).around(
        lambda: time.sleep(0.8) or "done")
    assert result == "done"
    assert len(started) == 2  # the one due at 60 s never starts
    assert started[0] < 0.3 <= started[1] < 0.8


def test_negative_start_times_are_refused() -> None:
    neighbours = load_benchmark("neighbours")
    with pytest.raises(ValueError, match="neighbour"):
        neighbours.Neighbours([-1.0])


def test_engine_vs_peers_takes_neighbours() -> None:
    bench = load_benchmark("engine_vs_peers")
    assert bench.parse_args(["--neighbour", "0", "--neighbour", "20"]).neighbour == [0.0, 20.0]
    with pytest.raises(SystemExit):
        bench.parse_args(["--neighbour", "-2"])


def test_compare_runs_each_system_beside_its_neighbours(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_benchmark("engine_vs_peers")
    record = {"prefill_ms": 100.0, "concurrent": {"out_tok_s": 300.0},
              "decode": {"b1": {"ms_per_step": 20.0, "ms_per_step_wall": 20.0},
                         "b8": {"ms_per_step": 30.0, "ms_per_step_wall": 30.0}}}
    monkeypatch.setattr(bench, "available",
                        lambda args: {"andante": lambda: time.sleep(0.3) or record})
    result = bench.compare(bench.parse_args(["--neighbour", "0"]))
    run = result["runs"]["andante"][0]
    assert run["record"] == record and len(run["machine"]["neighbours_started_s"]) == 1
    assert result["neighbours_start_after_s"] == [0.0]
