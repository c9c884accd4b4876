"""QoE gain estimation (Andes §4.1): closed forms against the metric, hand-made cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from andante.core.sampling import SLO
from andante.metrics.qoe import qoe
from andante.policies.andes.qoe import NO_LATENESS, RequestTable, Streams, objective_gain, qoe_at
from tests.engine.helpers import make_request

DT = 10.0


def _streams(arrival: float, ttft: float, tds: float, times: list[float]) -> Streams:
    """The summary of a timeline, computed the slow way."""
    start, inv = arrival + ttft, 1.0 / tds
    late, pos = NO_LATENESS, 0.0
    for k, t in enumerate(times):
        late = max(late, t - k * inv - start)
        pos += max(late, 0.0)
    return Streams(np.array([start]), np.array([inv]), np.array([float(len(times))]),
                   np.array([late]), np.array([pos]))


def _predicted(now: float, t: float, first: float, tau: float) -> list[float]:
    out, x = [], now + first
    while x <= t:
        out.append(x)
        x += tau
    return out


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_equals_the_metric_on_random_timelines(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(300):
        arrival, ttft, tds = rng.uniform(0, 5), rng.uniform(0.2, 3), rng.uniform(2, 10)
        n = int(rng.integers(0, 40))
        now = arrival + rng.uniform(0, 25)
        times = sorted(rng.uniform(arrival, now, n).tolist())
        s = _streams(arrival, ttft, tds, times)
        t = now + rng.uniform(0, 15)
        assert qoe_at(s, now, t)[0] == pytest.approx(qoe(arrival, times, ttft, tds, now=t),
                                                      abs=1e-9)
        first = rng.uniform(0, 3)
        tau = float(rng.choice([rng.uniform(0.01, 0.5), 1.0 / tds, 0.02]))
        served = times + _predicted(now, t, first, tau)
        expected = qoe(arrival, served, ttft, tds, now=t)
        assert qoe_at(s, now, t, np.array([first]), tau)[0] == pytest.approx(expected, abs=1e-9)


def test_broadcasts_over_batch_sizes() -> None:
    s = _streams(0.0, 1.0, 4.0, [1.0, 1.1, 1.2])
    tau = np.array([[0.05], [0.5], [2.0]])
    q = qoe_at(s, 2.0, 12.0, tau, tau)
    assert q.shape == (3, 1)
    assert q[0, 0] >= q[1, 0] >= q[2, 0]  # slower generation, lower QoE


def test_fresh_waiting_request_gains_everything() -> None:
    s = _streams(0.0, 1.0, 4.8, [])
    wait = qoe_at(s, 0.0, DT)[0]
    serve = qoe_at(s, 0.0, DT, np.array([0.2]), 0.03)[0]
    assert wait == 0.0 and serve == 1.0


def test_reader_buffered_beyond_horizon_gains_nothing() -> None:
    # 200 tokens in the first second: at 4 tokens/s that is 50 s of reading.
    times = [0.5 + 0.005 * k for k in range(200)]
    s = _streams(0.0, 1.0, 4.0, times)
    wait = qoe_at(s, 2.0, 2.0 + DT)[0]
    serve = qoe_at(s, 2.0, 2.0 + DT, np.array([0.03]), 0.03)[0]
    assert wait == serve == 1.0


def test_reader_about_to_run_dry_gains() -> None:
    # 20 tokens delivered on time, then nothing: the buffer empties at ~5 s.
    times = [1.0 + 0.25 * k for k in range(20)]
    s = _streams(0.0, 1.0, 4.0, times)
    wait = qoe_at(s, 5.0, 5.0 + DT)[0]
    serve = qoe_at(s, 5.0, 5.0 + DT, np.array([0.03]), 0.03)[0]
    assert serve == pytest.approx(1.0) and wait < 0.9


def test_slow_generation_breaks_perfect_qoe() -> None:
    """Fig. 7: a larger batch generates slower than the reader and QoE drops."""
    s = _streams(0.0, 1.0, 5.0, [])
    fast = qoe_at(s, 0.0, DT, np.array([0.1]), 0.1)[0]
    slow = qoe_at(s, 0.0, DT, np.array([0.1]), 0.4)[0]
    assert fast == 1.0 and slow < 1.0


def test_objectives() -> None:
    serve = np.array([1.0, 1.0, 0.5, 1.0])
    wait = np.array([1.0, 0.4, 0.2, 0.6])
    now = np.array([1.0, 1.0, 0.3, 0.9])
    assert objective_gain("avg", serve, wait, now).tolist() == pytest.approx([0, 0.6, 0.3, 0.4])
    assert objective_gain("perfect", serve, wait, now).tolist() == [0, 1, 0, 0]
    gain = objective_gain("min", serve, wait, now, q_min=0.5)
    assert np.argmax(gain) == 2  # its waiting QoE would fall furthest below the minimum
    with pytest.raises(ValueError, match="objective"):
        objective_gain("max", serve, wait, now)


def test_request_table_tracks_timelines_incrementally() -> None:
    table = RequestTable(capacity=1)  # forces growth
    reqs = [make_request(f"r{i}", 8, 50, arrival=0.1 * i, slo=SLO(ttft=1.0, tds=3.0 + i))
            for i in range(5)]
    for req in reqs:
        table.add(req)
    rng = np.random.default_rng(0)
    now = 1.0
    for _ in range(30):
        now += float(rng.uniform(0.01, 0.6))
        got = [r for r in reqs if rng.random() < 0.6]
        for r in got:
            r.append_output_token(1, now)
        table.record(table.indices(got), now)
    for req in reqs:
        [slot] = table.slots_of([req])
        ref = _streams(req.arrival_time, 1.0, req.slo.tds or 0.0, req.timeline.token_times)
        assert table.n[slot] == ref.n[0] and table.pos[slot] == pytest.approx(ref.pos[0])
        assert table.late[slot] == pytest.approx(ref.late[0])
        dry = req.arrival_time + 1.0 + (ref.n[0] - 1) / req.slo.tds + ref.late[0]  # type: ignore[operator]
        assert table.buffered(np.array([slot]), now)[0] == pytest.approx(max(dry - now, 0.0))
    table.remove(reqs[0])
    assert table.slots_of(reqs) == [1, 2, 3, 4]
    assert table.add(make_request("new", 4, 4)) == 0  # the freed slot is reused
    assert math.isfinite(float(table.start[0]))


def test_a_stall_shorter_than_the_buffer_costs_nothing() -> None:
    """The refiner's shortcut: generated at least as fast as read, a stream whose reader
    needs its next token after τ + O loses no QoE from an O-second stall."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(500):
        tds = float(rng.uniform(2, 8))
        n = int(rng.integers(1, 60))
        times = sorted(rng.uniform(0.0, 6.0, n).tolist())
        s = _streams(0.0, 1.0, tds, times)
        now = float(times[-1] + rng.uniform(0, 2))
        tau, stall = float(rng.uniform(0.01, 1.0 / tds)), float(rng.uniform(0, 3))
        slack = s.start[0] + s.n[0] * s.inv[0] + max(s.late[0], 0.0) - now
        if slack < tau + stall:
            continue
        checked += 1
        on_time = qoe_at(s, now, now + DT, np.array([tau]), tau)[0]
        stalled = qoe_at(s, now, now + DT, np.array([tau + stall]), tau)[0]
        assert stalled == pytest.approx(on_time, abs=1e-12)
    assert checked > 50
