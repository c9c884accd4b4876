"""Simulating a profile with a new-size setup (a calibrated CPU): the first request of
a size pays it, a warmed instance does not, and runs of steps still change nothing but
speed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from andante.perf.catalog import get_hardware, get_model, save_hardware
from andante.perf.cost_model import CostModel
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.step_sizes import NO_BUCKETS_ENV
from andante.sim import ClusterSpec, build_simulator, simulate
from andante.workload import RequestSpec, WorkloadConfig, build_workload, to_requests

MODEL = "smollm2-135m"


@pytest.fixture
def cpu_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A saved profile whose first step of a size costs 20 ms + 0.1 ms per token more."""
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path))
    # the unbucketed engine: with step-size buckets a warmed instance pays no setup
    # (tests/perf/test_step_buckets.py)
    monkeypatch.setenv(NO_BUCKETS_ENV, "1")
    hardware = dataclasses.replace(get_hardware("a10-24g"), name="cpu-setup",
                                   new_size_fixed=0.02, new_size_per_token=1e-4,
                                   new_size_cache=170)
    save_hardware(hardware)
    return hardware.name


def _ttft(spec: ClusterSpec, workload: list[RequestSpec], warm: tuple[int, ...]) -> float:
    simulator = build_simulator(spec)
    simulator.instances[0].engine.executor.step_sizes.warm(warm)  # type: ignore[attr-defined]
    requests = to_requests(workload)
    simulator.run(requests)
    return requests[0].timeline.token_times[0] - requests[0].arrival_time


def test_a_cold_size_costs_its_setup_once(cpu_like: str) -> None:
    spec = ClusterSpec(model=MODEL, hardware=cpu_like)
    one = [RequestSpec(arrival_time=0.0, prompt_len=200, output_len=4)]
    cold, warm = _ttft(spec, one, ()), _ttft(spec, one, (200,))
    cost = CostModel(get_model(MODEL), get_hardware(cpu_like))
    assert cold - warm == pytest.approx(cost.new_size_time(200))
    assert warm == pytest.approx(_ttft(ClusterSpec(model=MODEL, hardware="a10-24g"), one, ()))


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "vllm-v0"])
def test_runs_give_the_timelines_of_stepping(cpu_like: str, policy: str) -> None:
    workload = build_workload(WorkloadConfig(kind="poisson", rate=30.0, num_requests=120,
                                             lengths="uniform:16:600:4:80", seed=5))
    spec = ClusterSpec(model=MODEL, hardware=cpu_like, policy=policy)
    stepped = simulate(spec, workload, decode_runs=False)
    fast = simulate(spec, workload, decode_runs=True)
    times = {r.request_id: tuple(r.timeline.token_times) for r in stepped.requests}
    assert {r.request_id: tuple(r.timeline.token_times) for r in fast.requests} == times
    assert fast.report.end_time == stepped.report.end_time
    # the setup shows: the same workload on the profile without it ends sooner
    plain = simulate(ClusterSpec(model=MODEL, hardware="a10-24g", policy=policy), workload)
    assert plain.report.end_time < stepped.report.end_time
