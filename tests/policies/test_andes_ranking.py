"""`ranking.QueueRanking` gives the plain computation's priority order (gains of every
queued request, `knapsack.priority`, `top_order`) and its first request, without any
gain when a starved request leads; and `_order_queue` with it decides as the plain
computation does on a memory-pressure run (issue 30, item 7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.policies.andes import AndesPolicy
from andante.policies.andes.knapsack import (
    RUNNING,
    SWAPPED,
    WAITING,
    QueueRanking,
    View,
    priority,
    starvation,
    top_order,
)
from andante.policies.andes.options import AndesOptions
from andante.policies.andes.qoe import Streams, qoe_gain
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload, to_requests
from tests.policies.test_andes_fast_paths import _order_queue_scoring_all

NOW = 100.0

_stream = st.tuples(
    st.sampled_from([0.0, 0.0, 1.0, 7.0]),  # tokens delivered (0: never served)
    st.sampled_from([NOW - 3.0, NOW - 1.0, NOW - 1e-13, NOW, NOW + 0.5, NOW + 5.0]),  # start
    st.sampled_from([0.05, 0.2]),  # 1 / tds
    st.integers(min_value=1, max_value=40),  # weight (blocks)
    st.booleans(),  # swapped
)


def _view(running: int, queued: list[tuple[float, float, float, int, bool]]) -> View:
    rows = [(3.0, NOW - 2.0, 0.1, 5, False)] * running + queued
    n = np.array([r[0] for r in rows])
    start = np.array([r[1] for r in rows])
    inv = np.array([r[2] for r in rows])
    late = np.where(n > 0, 0.3, -1e9)
    streams = Streams(start, inv, n, late, np.where(n > 0, 0.2, 0.0))
    kind = np.array([RUNNING] * running + [SWAPPED if r[4] else WAITING for r in queued],
                    dtype=np.int8)
    weight = np.array([float(r[3]) for r in rows])
    base = np.where(kind == WAITING, 0.4, 0.0) + np.where(kind == SWAPPED, 0.1, 0.0)
    step = (kind != WAITING).astype(float)
    return View([object()] * len(rows), running, np.arange(len(rows)), streams, kind,  # type: ignore[list-item]
                weight, base, step)


@settings(max_examples=300, deadline=None)
@given(running=st.integers(min_value=0, max_value=3),
       queued=st.lists(_stream, min_size=1, max_size=10),
       limit=st.sampled_from([0.0, 0.5, float("inf")]),
       max_num_seqs=st.sampled_from([1, 3, 256]),
       objective=st.sampled_from(["avg", "min"]),
       size_aware=st.booleans())
def test_the_lazy_order_is_the_plain_order(running: int, queued: list, limit: float,
                                           max_num_seqs: int, objective: str,
                                           size_aware: bool) -> None:
    view = _view(running, queued)
    options = AndesOptions(objective=objective, size_aware=size_aware)
    tau = 0.03
    scored = []

    def score() -> tuple[float, np.ndarray]:
        scored.append(1)
        q = view.queued
        return tau, qoe_gain(view.streams.select(q), NOW, options.delta_t,
                             view.base[q] + view.step[q] * tau, tau, objective, view.streams)

    starved = starvation(view, NOW, limit)
    ranking = QueueRanking(view, options, max_num_seqs, starved, score)
    first, sure = ranking.first, ranking.sure_first()
    lazy_scored = len(scored)
    _, gain = score()
    prio = priority(gain, view.weight[view.queued], view.kind[view.queued], options,
                    None if starved is None else starved[view.queued])
    plain = top_order(prio, max_num_seqs) + running
    assert first == plain[0]
    assert np.array_equal(ranking.order(), plain)
    if sure is not None or len(queued) == 1:
        assert lazy_scored == 0  # the first was known without a single gain
    if sure is not None:
        assert starved is not None and starved[sure] > 0


def test_a_starved_lead_is_known_and_a_tie_is_not() -> None:
    def unscored() -> tuple[float, np.ndarray]:
        raise AssertionError("scored")

    lone = _view(1, [(0.0, NOW - 2.0, 0.1, 9, False), (0.0, NOW - 1.0, 0.1, 1, False)])
    ranking = QueueRanking(lone, AndesOptions(), 256, starvation(lone, NOW, 0.0), unscored)
    assert ranking.sure_first() == 1  # waited longest past its target
    tie = _view(1, [(0.0, NOW - 2.0, 0.1, 9, False), (0.0, NOW - 2.0, 0.2, 1, True)])
    ranking = QueueRanking(tie, AndesOptions(), 256, starvation(tie, NOW, 0.0), unscored)
    assert ranking.sure_first() is None


def _pressure_run(plain: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list[bool]]:
    scored: list[bool] = []  # per lazy ranking of a queue of several: were gains computed?
    if plain:
        monkeypatch.setattr(AndesPolicy, "_order_queue", _order_queue_scoring_all)
    else:
        rankings: dict[int, int] = {}  # id of a ranking -> its index in `scored`
        original_init, original_scores = QueueRanking.__init__, QueueRanking.scores

        def init(self, view, *args):  # type: ignore[no-untyped-def]
            original_init(self, view, *args)
            if len(view) > view.num_running + 1:
                rankings[id(self)] = len(scored)
                scored.append(False)

        def scores(self):  # type: ignore[no-untyped-def]
            if id(self) in rankings:
                scored[rankings[id(self)]] = True
            return original_scores(self)

        monkeypatch.setattr(QueueRanking, "__init__", init)
        monkeypatch.setattr(QueueRanking, "scores", scores)
    workload = build_workload(WorkloadConfig(
        kind="poisson", rate=1.5, num_requests=120, lengths="sharegpt", max_context=8192,
        seed=1))
    spec = ClusterSpec(model="llama-3.1-8b", hardware="a100-80g", policy="andes",
                       num_kv_blocks=1200)
    requests = to_requests(workload)
    simulator = build_simulator(spec)
    simulator.run(requests)
    lines = {r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                            r.timeline.num_swaps_out, r.status) for r in requests}
    return lines, scored


def test_the_lazy_order_decides_as_the_plain_one_under_memory_pressure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lazy, scored = _pressure_run(False, monkeypatch)
    plain, _ = _pressure_run(True, monkeypatch)
    assert lazy == plain
    assert True in scored and False in scored  # both: the gains decided, or they did not
    assert any(n or s for _, n, s, _ in lazy.values())  # preemptions: the refiner paired
