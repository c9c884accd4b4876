"""`andante experiment andes --quick` writes its report, plots and results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.andes_report import sustained
from experiments.registry import ExperimentContext, experiment_names, run_experiment


def test_sustained_intensity_interpolates_the_first_crossing() -> None:
    assert sustained([1, 2, 3], [0.99, 0.97, 0.5]) == pytest.approx(2 + 0.02 / 0.47)
    assert sustained([1, 2], [0.9, 0.99]) is None
    assert sustained([1, 2], [0.99, 0.98]) == 2


@pytest.mark.slow
def test_quick_experiment_writes_a_report(tmp_path: Path) -> None:
    assert "andes" in experiment_names()
    report = run_experiment("andes", ExperimentContext(tmp_path, quick=True))
    text = (tmp_path / "report.md").read_text()
    for heading in ("Headline", "Fig. 15", "Fig. 17", "Fig. 18", "Fig. 20", "Real trace"):
        assert heading in text
    assert (tmp_path / "fig15_intensity.png").stat().st_size > 1000
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True and "headline" in results
    qoe = results["fig15"]["qoe"]
    panel = next(iter(qoe.values()))
    assert panel["andes"][-1] > panel["vllm"][-1]  # the heavier burst
    assert report.directory == tmp_path


@pytest.mark.parametrize("policy", ["andes", "lqsf", "vllm"])
def test_queue_samples_do_not_depend_on_the_simulators_runs(policy: str) -> None:
    """The queue figures (peak queue) sample a fixed grid: the simulator's runs of
    steps report the same waiting and swapped counts as stepping."""
    from andante.sim import ClusterSpec, build_simulator
    from andante.workload import WorkloadConfig, build_workload, to_requests
    from experiments.andes_runs import Probe

    workload = WorkloadConfig(kind="gamma", rate=6.0, cv=3.0, num_requests=80,
                              lengths="uniform:200:4000:20:300", seed=3, max_context=8192)
    queues = []
    for runs in (False, True):
        sim = build_simulator(ClusterSpec(hardware="a10-24g", policy=policy,
                                          gpu_memory_utilization=0.85), decode_runs=runs)
        probe = Probe(sim.instances[0].engine.scheduler.policy, 2.0)
        sim.instances[0].engine.add_observer(probe)
        sim.run(to_requests(build_workload(workload)))
        queues.append(([(t, waiting, swapped) for t, waiting, _, swapped, _ in probe.samples],
                       probe.peak_queue))
    assert queues[0] == queues[1]
    samples, peak = queues[0]
    assert peak >= max(q[1] + q[2] for q in samples) > 5  # a queue formed
