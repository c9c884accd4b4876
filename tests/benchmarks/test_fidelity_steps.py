"""fidelity.py's per-step comparison (StepTrace) and serve_vs_vllm's verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from andante.core import Request, SamplingParams
from andante.engine.engine import StepOutput
from andante.engine.stats import SchedulerStats
from andante.exec.batch import StepBatch, StepResult
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.specs import CostCoefficients
from tests.benchmarks.scripts import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def _step(chunks: list[tuple[int, int]]) -> StepBatch:
    batch = StepBatch()
    params = SamplingParams(max_tokens=8, temperature=0.0)
    for i, (new, cached) in enumerate(chunks):
        batch.add(Request(f"r{i}", [1] * (new + cached), params, 0.0), new, cached, True, [0])
    return batch


def test_step_trace_compares_each_kind_with_the_model() -> None:
    fidelity = load_benchmark("fidelity")
    model = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    slower = model.with_coefficients(CostCoefficients(c2=2.0, c5=0.01))
    clock = _Clock()
    trace = fidelity.StepTrace(model, clock, single_fit=slower)
    busy = SchedulerStats(num_running=2)
    steps = [[(1, 40), (1, 90)], [(64, 0), (1, 91)], [(30, 0)], [(1, 41), (1, 92)]]
    for chunks in steps:
        batch = _step(chunks)
        duration = model.step_time(batch.shape()) * 1.5  # the engine runs 1.5x slower
        clock.t += duration + 0.002  # plus 2 ms of loop between steps
        trace(StepOutput(batch, StepResult([1] * len(chunks), duration)), busy)
    summary = trace.summary()
    assert [r["kind"] for r in trace.rows] == ["decode", "mixed", "prefill", "decode"]
    assert summary["decode"]["steps"] == 2
    for kind in ("decode", "mixed", "prefill"):
        assert summary[kind]["ratio"] == pytest.approx(1.5, abs=1e-3)
        assert summary[kind]["ratio_median"] == pytest.approx(1.5, abs=1e-3)
        assert summary[kind]["ratio_single_fit"] < 1.5  # the slower model predicts more
    assert summary["loop_median_ms"] == pytest.approx(2.0, abs=1e-3)


def test_serve_verdict_compares_with_vllm() -> None:
    serve = load_benchmark("serve_vs_vllm")
    ours = {"burst": {"request_goodput": 1.9, "p99_ttft_ms": 800.0, "mean_qoe": 0.99},
            "poisson": {"request_goodput": 1.8, "p99_ttft_ms": 900.0, "mean_qoe": 0.98}}
    theirs = {"burst": {"request_goodput": 1.8, "p99_ttft_ms": 900.0, "mean_qoe": 0.99},
              "poisson": {"request_goodput": 1.9, "p99_ttft_ms": 800.0, "mean_qoe": 0.99}}
    assert serve.verdict(ours, theirs) == {
        "burst": {"goodput": True, "ttft_p99": True, "qoe": True},
        "poisson": {"goodput": False, "ttft_p99": False, "qoe": False}}


def test_step_trace_adds_the_setup_of_sizes_new_to_the_engine() -> None:
    import dataclasses

    fidelity = load_benchmark("fidelity")
    hardware = dataclasses.replace(get_hardware("a10-24g"), new_size_fixed=0.01,
                                   new_size_per_token=1e-4, new_size_cache=8)
    model = CostModel(get_model("smollm2-135m"), hardware)
    trace = fidelity.StepTrace(model, _Clock(), history=(65,))  # the engine ran 65 tokens
    busy = SchedulerStats(num_running=2)
    steps = [[(64, 0), (1, 91)], [(30, 0)], [(1, 41), (1, 92)], [(1, 42), (1, 93)]]
    for chunks in steps:
        batch = _step(chunks)
        trace(StepOutput(batch, StepResult([1] * len(chunks), 0.05)), busy)
    assert [r["new_size"] for r in trace.rows] == [False, True, True, False]
    for row, chunks in zip(trace.rows, steps, strict=True):
        warm = model.step_time(_step(chunks).shape()) * 1e3
        setup = model.new_size_time(row["tokens"]) * 1e3 if row["new_size"] else 0.0
        assert row["predicted_ms"] == pytest.approx(warm + setup)
    summary = trace.summary()
    assert summary["decode"]["new_sizes"] == 1
    assert set(summary["decode"]) >= {"ratio_new_sizes", "ratio_warm_sizes"}
    assert "ratio_warm_sizes" not in summary["prefill"]  # its one step was new


def test_size_recorder_keeps_the_sizes_of_forward_steps() -> None:
    fidelity = load_benchmark("fidelity")

    class Inner:
        name = "inner"

        def execute(self, batch: StepBatch) -> StepResult:
            return StepResult([1] * len(batch.requests), 0.01)

    recorder = fidelity.SizeRecorder(Inner())
    recorder.execute(_step([(30, 0), (1, 5)]))
    recorder.execute(StepBatch())  # a swap-only or empty step runs no forward pass
    recorder.execute(_step([(1, 6)]))
    assert recorder.sizes == [31, 1] and recorder.name == "inner"


def test_step_trace_logs_the_idle_time_before_a_step() -> None:
    fidelity = load_benchmark("fidelity")
    model = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    clock = _Clock()
    trace = fidelity.StepTrace(model, clock)
    busy, idle = SchedulerStats(num_running=1), SchedulerStats()
    for chunks, stats, wait in (([(30, 0)], busy, 0.0), ([(1, 30)], idle, 0.001),
                                ([(40, 0)], busy, 0.5), ([(1, 40)], busy, 0.001)):
        batch = _step(chunks)
        duration = model.step_time(batch.shape())
        clock.t += wait + duration  # `wait`: time before the step started
        trace(StepOutput(batch, StepResult([1] * len(chunks), duration)), stats)
    idle_ms = [r["idle_before_ms"] for r in trace.rows]
    assert idle_ms[0] is None and idle_ms[1] is None and idle_ms[3] is None
    assert idle_ms[2] == pytest.approx(500.0, abs=1e-6)  # the engine had run out of work
    assert trace.rows[2]["loop_ms"] is None


def test_caching_phases_in_order() -> None:
    fidelity = load_benchmark("fidelity")
    assert fidelity.caching_phases("both") == ["off", "on"]
    assert fidelity.caching_phases("on,off,on") == ["on", "off", "on"]
    assert fidelity.caching_phases("off") == ["off"]
    with pytest.raises(ValueError, match="--prefix-caching"):
        fidelity.caching_phases("on,maybe")


def test_the_wait_policy_is_the_environments_when_torch_loads_openmp() -> None:
    """OpenMP reads OMP_WAIT_POLICY once, when torch loads it: fidelity.py must leave the
    environment's choice (the served engine's) in force, unset included."""
    probe = (
        "import importlib.abc, os, sys\n"
        "seen = []\n"
        "class Watch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' and not seen:\n"
        "            seen.append(os.environ.get('OMP_WAIT_POLICY'))\n"
        "        return None\n"
        "sys.meta_path.insert(0, Watch())\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "import fidelity\n"
        "import torch  # where fidelity.py has not loaded it yet: as its engine does later\n"
        "print(seen[0])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "None"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "ACTIVE"


def test_outside_cpu_is_the_machine_less_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    fidelity = load_benchmark("fidelity")
    readings = iter([(100.0, 5.0, 10.0), (103.0, 6.0, 12.0)])  # (busy, own, wall) s
    monkeypatch.setattr(fidelity.OutsideCpu, "_read", staticmethod(lambda: next(readings)))
    monkeypatch.setattr(fidelity.os, "cpu_count", lambda: 2)
    # 3 s busy of which 1 s this process's, over 2 s on 2 cores
    assert fidelity.OutsideCpu().share() == pytest.approx(0.5)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs /proc/stat")
def test_outside_cpu_sees_another_process_spin() -> None:
    fidelity = load_benchmark("fidelity")
    meter = fidelity.OutsideCpu()
    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True, timeout=60)
    share = meter.share()
    assert share is not None and share >= 0.3 / (os.cpu_count() or 1)


def test_step_trace_tells_a_tail_from_a_shift() -> None:
    fidelity = load_benchmark("fidelity")
    model = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    trace = fidelity.StepTrace(model, _Clock())
    busy = SchedulerStats(num_running=1)
    for slow in (1.0, 1.0, 1.0, 1.0, 3.0):  # one step in five runs 3x the prediction
        batch = _step([(1, 40)])
        duration = model.step_time(batch.shape()) * slow
        trace(StepOutput(batch, StepResult([1], duration)), busy)
    decode = trace.summary()["decode"]
    assert decode["ratio"] == pytest.approx(1.4, abs=1e-3)
    assert decode["ratio_median"] == pytest.approx(1.0, abs=1e-3)


def test_served_steps_cost_their_forward_pass_and_loop_and_fit_as_a_log() -> None:
    fidelity = load_benchmark("fidelity")
    model = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    clock = _Clock()
    trace = fidelity.StepTrace(model, clock)
    busy, idle = SchedulerStats(num_running=1), SchedulerStats()
    plan = [([(40 + 16 * i, 0), (1, 90)], busy, 0.0) for i in range(12)]
    plan += [([(1, 40 + i)] * (1 + i % 6), busy, 0.0) for i in range(40)]
    plan += [([(1, 30)], idle, 0.0), ([(64, 0)], busy, 0.5)]  # ran dry, then 0.5 s idle
    for chunks, stats, wait in plan:
        batch = _step(chunks)
        duration = model.step_time(batch.shape())
        clock.t += wait + duration + 0.003  # 3 ms of loop before each step
        trace(StepOutput(batch, StepResult([1] * len(chunks), duration)), stats)
    steps = fidelity.served_steps(trace)
    assert len(steps) == len(plan) and steps[1].engine == "andante"
    assert steps[1].duration == pytest.approx(model.step_time(steps[1].shape) + 0.003)
    assert steps[0].duration == pytest.approx(model.step_time(steps[0].shape))  # no loop yet
    assert steps[-1].idle_before == pytest.approx(0.503)  # the wake's fit sees the gap
    fit = fidelity.fit_step_log(steps, get_model("smollm2-135m"), get_hardware("a10-24g"), "x")
    served = CostModel(get_model("smollm2-135m"), fit.hardware)
    shape = steps[20].shape  # a served decode costs its loop too
    assert served.step_time(shape) == pytest.approx(model.step_time(shape) + 0.003, rel=0.05)


def test_a_trace_is_predicted_again_by_a_profile_fitted_after_it() -> None:
    """--calibrate-from-load fits its segments once every rate has run: each rate's step
    ratios are then taken against that fit, and the steps record their thread count."""
    import torch

    fidelity = load_benchmark("fidelity")
    model = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    slower = model.with_coefficients(CostCoefficients(c2=2.0))
    trace = fidelity.StepTrace(model, _Clock())
    busy = SchedulerStats(num_running=1)
    for chunks in ([(1, 40)], [(64, 0), (1, 41)]):
        batch = _step(chunks)
        trace(StepOutput(batch, StepResult([1] * len(chunks),
                                           slower.step_time(batch.shape()))), busy)
    assert trace.summary()["decode"]["ratio"] != pytest.approx(1.0, abs=0.05)
    trace.repredict(slower)
    summary = trace.summary()
    assert summary["decode"]["ratio"] == pytest.approx(1.0, abs=1e-3)
    assert summary["mixed"]["ratio"] == pytest.approx(1.0, abs=1e-3)
    threads = str(torch.get_num_threads())
    assert summary["decode"]["steps_and_ratio_by_threads"] == {threads: [1, 1.0]}
    assert [s.threads for s in fidelity.served_steps(trace)] == [int(threads)] * 2
