"""The simulator's front end (a profile's `frontend_in` and `frontend_out`): a request
reaches the engine `frontend_in` after it arrives, each token reaches the metrics
`frontend_out` after the engine emits it; TPOT moves by nothing, and a profile without
them (every built-in) simulates exactly as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, save_hardware
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.specs import HardwareSpec
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import WorkloadConfig, build_workload

BASE = get_hardware("a10-24g")
WORKLOAD = build_workload(WorkloadConfig(kind="poisson", rate=4.0, num_requests=24,
                                         lengths="uniform:32:256:8:48", seed=3))


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    return tmp_path


def _run(name: str, frontend_in: float, frontend_out: float, streamed: bool = False):
    save_hardware(dataclasses.replace(BASE, name=name, frontend_in=frontend_in,
                                      frontend_out=frontend_out))
    spec = ClusterSpec(model="smollm2-135m", hardware=name, policy="vllm",
                       scheduler=SchedulerConfig(max_num_seqs=8))
    return simulate(spec, WORKLOAD, keep_records=not streamed)


def test_a_profile_without_a_front_end_simulates_exactly_as_the_base_profile():
    plain = simulate(ClusterSpec(model="smollm2-135m", hardware=BASE.name, policy="vllm",
                                 scheduler=SchedulerConfig(max_num_seqs=8)), WORKLOAD)
    zero = _run("zero-front", 0.0, 0.0)
    assert [r.token_times for r in zero.records] == [r.token_times for r in plain.records]


def test_the_time_after_the_engine_moves_every_token_and_nothing_else():
    base, out = _run("no-front", 0.0, 0.0), _run("out-front", 0.0, 0.040)
    for a, b in zip(base.records, out.records, strict=True):
        assert b.token_times == pytest.approx([t + 0.040 for t in a.token_times])
    assert out.summary.ttft.mean == pytest.approx(base.summary.ttft.mean + 0.040)
    assert out.summary.tpot.mean == pytest.approx(base.summary.tpot.mean)


@settings(max_examples=6, deadline=None)
@given(st.floats(0.0, 0.2), st.floats(0.0, 0.2))
def test_a_lone_request_pays_both_sides_in_its_ttft(frontend_in: float, frontend_out: float):
    lone = build_workload(WorkloadConfig(kind="poisson", rate=1.0, num_requests=1,
                                         lengths="uniform:64:64:8:8", seed=0))
    spec = ClusterSpec(model="smollm2-135m", hardware=BASE.name, policy="vllm")
    base = simulate(spec, lone).records[0]
    save_hardware(dataclasses.replace(BASE, name="lone-front", frontend_in=frontend_in,
                                      frontend_out=frontend_out))
    fronted = simulate(dataclasses.replace(spec, hardware="lone-front"), lone).records[0]
    assert fronted.arrival_time == base.arrival_time  # the client's arrival, as served
    assert fronted.token_times == pytest.approx(
        [t + frontend_in + frontend_out for t in base.token_times])


def test_the_time_before_the_engine_delays_its_queue_and_a_streamed_run_agrees():
    kept, streamed = _run("both-front", 0.030, 0.010), _run("both-front", 0.030, 0.010,
                                                            streamed=True)
    base = _run("none-front", 0.0, 0.0)
    assert kept.summary.ttft.mean > base.summary.ttft.mean + 0.030
    assert streamed.summary.ttft.mean == pytest.approx(kept.summary.ttft.mean)
    assert streamed.summary.tpot.mean == pytest.approx(kept.summary.tpot.mean)


def test_old_profiles_load_with_no_front_end_and_bad_values_are_refused():
    data = BASE.to_dict()
    del data["frontend_in"], data["frontend_out"]
    loaded = HardwareSpec.from_dict({**data, "name": "old"})
    assert (loaded.frontend_in, loaded.frontend_out) == (0.0, 0.0)
    with pytest.raises(ValueError, match="frontend_out must be a finite non-negative"):
        dataclasses.replace(BASE, frontend_out=-0.1)
