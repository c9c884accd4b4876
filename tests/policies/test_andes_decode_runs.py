"""Andes on the simulator's decode-run fast path: the same timelines as stepping, with
fewer scheduler iterations; the catch-up replays QoE state bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core.sampling import SLO
from andante.policies import SchedulerConfig
from andante.policies.andes.qoe import RequestTable
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload, to_requests
from andante.workload.slo import SLOConfig
from tests.engine.helpers import make_request

GAMMA_BURSTS = WorkloadConfig(kind="gamma", rate=30.0, cv=3.0, num_requests=120,
                              lengths="uniform:32:1500:1:300", seed=4)
# 20 requests admitted at once whose outputs then fill the KV past the watermark, with
# nothing queued; fast readers (the compute-bound trigger fires at every solve)
GROWING = WorkloadConfig(kind="gamma", rate=100.0, cv=1.0, num_requests=20,
                         lengths="uniform:400:600:1000:1500", seed=4, slo=SLOConfig(tds=100.0))


def _run(options: dict[str, object], runs: bool, policy: str = "andes",
         workload: WorkloadConfig = GAMMA_BURSTS,
         watermark: float = 0.01) -> tuple[dict[str, tuple], int, int, int]:
    spec = ClusterSpec(model="llama-3.1-8b", hardware="a10-24g", policy=policy,
                       policy_options=options,
                       scheduler=SchedulerConfig(max_num_seqs=64, watermark=watermark),
                       gpu_memory_utilization=0.85)  # small KV: queues and preemptions too
    sim = build_simulator(spec, decode_runs=runs)
    engine = sim.instances[0].engine
    outputs: list[int] = []
    engine.add_observer(lambda out, stats: outputs.append(out.num_steps))
    requests = to_requests(build_workload(workload))
    sim.run(requests)
    timelines = {r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                                r.timeline.num_swaps_out, r.status) for r in requests}
    policy_ = engine.scheduler.policy
    return timelines, engine.num_steps, len(outputs), policy_.stats.num_solves  # type: ignore[attr-defined]


@pytest.mark.parametrize("options", [{}, {"chunked_prefill": False},
                                     {"solver_interval": 1, "watermark": 0.5}])
def test_decode_runs_give_identical_timelines(options: dict[str, object]) -> None:
    stepped, steps, outputs_stepped, solves = _run(options, runs=False)
    fast, fast_steps, outputs_fast, fast_solves = _run(options, runs=True)
    assert fast == stepped
    assert (fast_steps, fast_solves) == (steps, solves)
    assert outputs_fast < outputs_stepped  # some decode steps were applied in runs


def test_without_the_refiner_nor_batch_search_andes_is_never_stationary() -> None:
    """The knapsack's victims are preempted then even with nobody to admit (a smaller
    batch may win), so every step is scheduled."""
    _, _, outputs_stepped, _ = _run({"refiner": False}, runs=False)
    _, _, outputs_fast, _ = _run({"refiner": False}, runs=True)
    assert outputs_fast == outputs_stepped


@pytest.mark.parametrize(("options", "workload", "watermark"), [
    ({}, GAMMA_BURSTS, 0.01), ({"solver_interval": 1, "watermark": 0.3}, GAMMA_BURSTS, 0.01),
    ({"solver_interval": 1}, GROWING, 0.2), ({"solver_interval": 1}, GROWING, 0.05),
])
def test_without_the_refiner_runs_leave_the_watermark_free(
        options: dict[str, object], workload: WorkloadConfig, watermark: float) -> None:
    """LQSF (no refiner, B = B_max) keeps every running request while the free blocks
    cover the watermark: decode runs that leave it free give the stepped timelines
    (GROWING crosses the watermark with nothing queued: runs ignoring it differ)."""
    stepped, steps, outputs_stepped, solves = _run(options, False, "lqsf", workload, watermark)
    fast, fast_steps, outputs_fast, fast_solves = _run(options, True, "lqsf", workload,
                                                       watermark)
    assert fast == stepped
    assert (fast_steps, fast_solves) == (steps, solves)
    assert outputs_fast < outputs_stepped


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.001, 2.0), min_size=1, max_size=30),
       st.integers(0, 5), st.floats(0.0, 5.0))
def test_record_run_equals_recording_each_token(gaps: list[float], before: int,
                                                start: float) -> None:
    reqs = [make_request(f"r{i}", 8, 100, arrival=0.3 * i, slo=SLO(ttft=1.0, tds=2.0 + i))
            for i in range(3)]
    one, run, few = RequestTable(), RequestTable(), RequestTable()
    for table in (one, run, few):
        for req in reqs:
            table.add(req)
    idx = one.indices(reqs)
    now = start
    for _ in range(before):  # some tokens recorded one by one in both
        now += 0.1
        one.record(idx, now)
        run.record(idx, now)
        few.record_few(idx.tolist(), [now])
    times = now + np.cumsum(gaps)
    for t in times:
        one.record(idx, float(t))
    run.record_run(idx, times)
    few.record_few(idx.tolist(), times.tolist())  # the plain-Python path
    for name in ("n", "late", "pos"):
        assert np.array_equal(getattr(one, name)[idx], getattr(run, name)[idx])
        assert np.array_equal(getattr(one, name)[idx], getattr(few, name)[idx])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.001, 0.5), min_size=1, max_size=40),
       st.lists(st.floats(0.0, 3.0), min_size=12, max_size=12),
       st.lists(st.floats(0.5, 20.0), min_size=12, max_size=12))
def test_record_run_skips_only_rows_that_stay_ahead(gaps: list[float], firsts: list[float],
                                                    speeds: list[float]) -> None:
    """Rows ahead of their readers, late ones and ones turning late in the run (the
    bound that lets `record_run` skip a row, and both ways of folding the others)."""
    reqs = [make_request(f"r{i}", 8, 100, arrival=0.0, slo=SLO(ttft=1.0, tds=speeds[i]))
            for i in range(12)]
    one, run = RequestTable(), RequestTable()
    for table in (one, run):
        for req, first in zip(reqs, firsts, strict=True):
            [slot] = table.indices([req])
            table.record(np.array([slot]), first)  # first tokens early or late
    idx = one.indices(reqs)
    times = 3.0 + np.cumsum(gaps)
    for t in times:
        one.record(idx, float(t))
    run.record_run(idx, times)
    for name in ("n", "late", "pos"):
        assert np.array_equal(getattr(one, name)[idx], getattr(run, name)[idx])
