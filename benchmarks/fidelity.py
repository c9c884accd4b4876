"""Simulator fidelity: the same Poisson workloads on the real engine and in the simulator.

Calibrates first, in the same run (the machine state the real runs then see): the step
sweep of `andante calibrate`, fitted and saved as the profile `cpu` in a private
profiles folder (the user's own profiles are not touched; `--no-calibrate` uses the
saved profile `--hardware` instead). Then, for each rate of `--rates` (default 0.5, 1
and 2 req/s): the real run replays the workload live (random prompt ids of the
workload's lengths, greedy, exactly `output_len` tokens, submitted when the wall clock
reaches their arrival times; the real scheduler, `--policy`, drives the TorchExecutor on
the embedded SmolLM2-135M), and the simulated run feeds the same workload to
`andante.sim.simulate` with `--model smollm2-135m` on the fitted profile. Target: mean
TTFT and mean TPOT within 10% (|sim - real| / real) at every rate.

`--prefix-caching on|off|both` (default both: every rate with it off, then on) sets the
engine's prefix caching on both sides (`SchedulerConfig.enable_prefix_caching`); the
prompts here share no prefix. A list such as `on,off,on` runs those phases in that
order (whether a phase's per-step ratios follow its place or its mode).

The simulated instance starts with the step sizes the real engine has run before the
timed requests (calibration, earlier rates, the warm-up), most recent last: a calibrated
profile charges the first step of a size not among its last `new_size_cache` sizes a
setup (andante.perf.step_sizes), and the real process keeps its primitives across rates,
so both sides start a rate in the same state.

`--calibrate-from-load` fits the simulator's profile to steps the real engine served
under calibration loads instead (`ServedCalibration`): one before the runs and, with
`--interleave-requests` (default 24), a short one after each run, all fitted once every
rate has run; the runs' own steps are never fitted. Each step records the thread count
it ran at (the engine adapts it while serving), and the per-step ratios are then taken
against that fit.

Per step (`steps` in each rate's result): the real engine's measured step durations
against the fitted cost model's prediction for the same shapes, by step kind (decode
only, prefill only, mixed), and the engine loop's own time between steps (scheduling,
bookkeeping) that the simulator does not model. Both sides of a ratio come from the same
run, so the machine's load moves them alike. `--step-log PATH` writes every step as a
JSON line. On a busy machine `--cpu-time` (with `--threads 1`) times every step, in the
calibration and in the real runs, in process CPU time instead of wall time: what a step
costs the CPU, which other processes barely move, so the per-kind ratios then test the
cost model's form even under load (the end-to-end TTFT/TPOT stay wall-clock figures and
are not comparable with the simulation in that mode).

Prints one JSON line: the fit error, per rate the real and simulated figures and their
errors, the worst error, and the load average before and after (the machine's load
moves the real figures: say so when reporting). `outside_cpu`, for the calibration and
each real run, is the share of the machine's CPU that other processes used meanwhile:
where one phase's steps run slower than calibrated by the same factor for every step
kind, this tells an outside load from a drift of the engine itself.
"""

from __future__ import annotations

# The wait policy is the environment's, as `andante serve` takes it (unset: libgomp's
# default, spinning workers, which stop 21's quiet figures used). OpenMP reads it once, when
# torch loads it, so this script never sets it after start: the JSON reports the one in force.
import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

from andante.core import MonotonicClock, Request, SamplingParams
from andante.engine.engine import StepOutput
from andante.engine.stats import SchedulerStats
from andante.metrics.record import records_from_requests
from andante.metrics.summary import Summary, summarize
from andante.perf.catalog import get_hardware, save_hardware
from andante.perf.cost_model import CostModel
from andante.perf.fit import fit_coefficients, prediction_error
from andante.perf.log_fit import LogFitRefused, fit_step_log
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.shape import BatchShape
from andante.perf.step_log import LoggedStep
from andante.perf.step_sizes import StepSizeCache
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, build_simulator
from andante.workload import RequestSpec, WorkloadConfig, build_workload
from andante.workload.spec import to_requests

TARGET = 0.10
PREFIX_CACHING_FIELD = "enable_prefix_caching"  # SchedulerConfig's switch, where it exists


def scheduler_config(prefix_caching: str) -> SchedulerConfig:
    """The engine limits both sides use, with prefix caching as asked where the build has
    it; ValueError for "on" where it does not."""
    config = SchedulerConfig(max_model_len=2048, max_num_batched_tokens=8192)
    if any(f.name == PREFIX_CACHING_FIELD for f in dataclasses.fields(config)):
        return dataclasses.replace(config, **{PREFIX_CACHING_FIELD: prefix_caching == "on"})
    if prefix_caching == "on":
        raise ValueError("--prefix-caching on: this build's engine has no prefix caching")
    return config


def caching_phases(text: str) -> list[str]:
    """`--prefix-caching`: the phases' modes in order ("both" is off, then on)."""
    modes = ["off", "on"] if text == "both" else text.split(",")
    for mode in modes:
        if mode not in ("on", "off"):
            raise ValueError(f"--prefix-caching: expected on, off, both or a comma-separated "
                             f"list of on/off, got {text!r}")
    return modes


def _executor(args: argparse.Namespace) -> tuple[Any, Any]:
    """The embedded model and one TorchExecutor, shared by the calibration and every real
    run (each run's engine starts with an empty KV cache). Its step buckets are warmed
    only after the calibration (`_warm_buckets`), so that the calibration times exact
    sizes cold and warm, as `andante calibrate` does."""
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.models import load_model

    model = load_model(None, "bfloat16")
    return model, TorchExecutor(model, TorchExecutorOptions(num_threads=args.threads,
                                                            kv_cache_gib=args.kv_cache_gib,
                                                            warmup_tokens=None))


def _warm_buckets(executor: Any) -> dict[str, Any]:
    """The served engine's start-up warm-up (every step bucket up to the model's length),
    run once the calibration is done."""
    warmup = executor.warm_up()
    return {"num_sizes": len(warmup.sizes), "seconds": round(warmup.seconds, 2)}


def step_kind(shape: BatchShape) -> str:
    if shape.num_decode_seqs == shape.num_seqs:
        return "decode"
    return "prefill" if shape.num_decode_seqs == 0 else "mixed"


class StepTrace:
    """An engine observer: each real step's shape, measured duration, the cost model's
    prediction for that shape, and the loop time since the previous step ended (only
    while the engine had work, so idle waits for arrivals are not counted)."""

    def __init__(self, cost_model: CostModel, clock: Any, single_fit: CostModel | None = None,
                 wall_loop: bool = True, history: tuple[int, ...] = ()) -> None:
        self.cost_model = cost_model
        self.single_fit = single_fit  # one coefficient set for every kind, for comparison
        self.sizes = StepSizeCache(cost_model.hardware.new_size_cache)
        self.sizes.warm(history)  # the sizes the engine ran before
        self.history = history
        self.clock = clock
        self.wall_loop = wall_loop  # the loop time is wall minus duration: off in CPU time
        self.rows: list[dict[str, Any]] = []
        self.shapes: list[BatchShape] = []  # each row's step shape (`served_steps`)
        self._last_end: float | None = None
        self._idle_since: float | None = None  # when the engine last ran out of work

    def __call__(self, output: StepOutput, stats: SchedulerStats) -> None:
        import torch  # loaded with the engine (lazily, as TorchExecutor is: sim-only runs
        # need none); the thread count the step ran at persists
        now = self.clock.now()
        shape = output.batch.shape()
        measured = output.result.duration
        gap = None if self._last_end is None else now - self._last_end - measured
        idle = None if self._idle_since is None else now - self._idle_since - measured
        busy = stats.num_running + stats.num_waiting + stats.num_swapped > 0
        self._last_end = now if busy else None
        self._idle_since = None if busy else now
        if not output.batch.requests:
            return
        new = self.sizes.miss(shape.num_tokens)
        setup = self.cost_model.new_size_time(shape.num_tokens) if new else 0.0
        self.shapes.append(shape)
        self.rows.append({"kind": step_kind(shape), "seqs": shape.num_seqs,
                          "tokens": shape.num_tokens, "kv_read": shape.kv_tokens_read,
                          "decodes": shape.num_decode_seqs, "pairs": shape.attn_pairs,
                          "threads": torch.get_num_threads(),
                          "new_size": new, "measured_ms": measured * 1e3,
                          "predicted_ms": (self.cost_model.step_time(shape) + setup) * 1e3,
                          "single_fit_ms": None if self.single_fit is None
                          else self.single_fit.step_time(shape) * 1e3,
                          "loop_ms": None if gap is None or not self.wall_loop
                          else gap * 1e3,
                          "idle_before_ms": None if idle is None else idle * 1e3})

    def repredict(self, cost_model: CostModel) -> None:
        """Each row's prediction again, by `cost_model` (a profile fitted after the run:
        `--calibrate-from-load` fits its segments once every rate has run)."""
        self.cost_model = cost_model
        for shape, row in zip(self.shapes, self.rows, strict=True):
            setup = cost_model.new_size_time(shape.num_tokens) if row["new_size"] else 0.0
            row["predicted_ms"] = (cost_model.step_time(shape) + setup) * 1e3

    def summary(self) -> dict[str, Any]:
        """Per kind: steps, medians, the measured / predicted ratio of the sums (what the
        mean TTFT and TPOT follow) and the median of the steps' ratios, and the ratio of
        the sums apart for the steps of sizes new to the engine and of warm ones."""
        out: dict[str, Any] = {}
        for kind in ("decode", "mixed", "prefill"):
            rows = [r for r in self.rows if r["kind"] == kind]
            if not rows:
                continue
            measured = [r["measured_ms"] for r in rows]
            predicted = [r["predicted_ms"] for r in rows]
            out[kind] = {"steps": len(rows), "new_sizes": sum(r["new_size"] for r in rows),
                         "measured_median_ms": round(float(np.median(measured)), 2),
                         "predicted_median_ms": round(float(np.median(predicted)), 2),
                         "ratio": round(sum(measured) / sum(predicted), 3),
                         # the typical step: where it is below `ratio`, a tail of slow
                         # steps, not a shift of every step, makes the difference
                         "ratio_median": round(float(np.median(
                             [m / p for m, p in zip(measured, predicted, strict=True)])), 3)}
            by_threads = {}
            for count in sorted({r["threads"] for r in rows}):
                part = [r for r in rows if r["threads"] == count]
                by_threads[str(count)] = [len(part), round(
                    sum(r["measured_ms"] for r in part) / sum(r["predicted_ms"] for r in part), 3)]
            out[kind]["steps_and_ratio_by_threads"] = by_threads
            for label, new in (("new", True), ("warm", False)):  # sizes new to the engine
                part = [r for r in rows if r["new_size"] is new]
                if part:
                    out[kind][f"ratio_{label}_sizes"] = round(
                        sum(r["measured_ms"] for r in part)
                        / sum(r["predicted_ms"] for r in part), 3)
            if self.single_fit is not None:
                single = sum(r["single_fit_ms"] for r in rows)
                out[kind]["ratio_single_fit"] = round(sum(measured) / single, 3)
        loops = [r["loop_ms"] for r in self.rows if r["loop_ms"] is not None]
        if loops:
            out["loop_median_ms"] = round(float(np.median(loops)), 3)
        return out


def served_steps(trace: StepTrace) -> list[LoggedStep]:
    """The trace's steps as a step log's (andante.perf.step_log), each costing what a
    served token paid for it: its forward pass plus the engine loop's time since the
    previous step ended (scheduling, bookkeeping, streaming; none after an idle wait),
    with the idle time before it where the engine had run dry (the wake's fit)."""
    return [LoggedStep(shape, (row["measured_ms"] + (row["loop_ms"] or 0.0)) / 1e3, line,
                       engine="andante", idle_before=None if row["idle_before_ms"] is None
                       else row["idle_before_ms"] / 1e3, threads=row["threads"])
            for line, (shape, row) in enumerate(zip(trace.shapes, trace.rows, strict=True),
                                                start=1)]


class ServedCalibration:
    """`--calibrate-from-load`: calibration workloads (other seeds than the timed runs',
    varied lengths) served by the real engine, a first one before the runs and, with
    `--interleave-requests`, a short one after each run; their steps, and none of the
    runs', fitted as a served log is (andante.perf.log_fit: forward pass plus loop time
    per step, wake, prefill and decode factors) on the base profile `args.hardware` (the
    sweep's where it ran). The simulator then uses that fit (`fit` saves it and makes
    `args.hardware` its name).

    Drift (design, as benchmarks/fidelity_from_log.py): a fit of one calibration run
    first bets on the engine's and the machine's speed then; segments interleaved with
    the runs spread the fitted steps over the whole benchmark, so the fit stands for its
    mean speed while the measured requests stay out of it. Measured here (issue 32 item
    5, quiet machine): one calibration load first put the runs' decode steps 11-14%
    above what they took, at every rate. The engine's state moves too: its thread
    adapter changes a step size's thread count while serving, so the same decode shape
    runs at one thread in one segment and two in another (22 of 50 steps of 1-3 decodes
    of a calibration load ran on two threads, against the profile's one-thread rule);
    each step's `threads` is recorded so a fit can be checked per thread count."""

    def __init__(self, args: argparse.Namespace, model_and_executor: tuple[Any, Any],
                 config: SchedulerConfig) -> None:
        self.args, self.model_and_executor, self.config = args, model_and_executor, config
        self.traces: list[StepTrace] = []
        self.wall_s = 0.0
        self.outside: list[float | None] = []

    def segment(self, num_requests: int) -> None:
        """Serve one calibration workload (its own seed) and keep its steps."""
        args = self.args
        workload = build_workload(WorkloadConfig(
            kind="poisson", rate=args.calibration_rate, num_requests=num_requests,
            lengths=args.calibration_lengths, seed=args.seed + 100 + len(self.traces)))
        started, outside = time.perf_counter(), OutsideCpu()
        _, trace = real_run(args, self.model_and_executor, workload, self.config)
        self.outside.append(outside.share())
        self.wall_s += time.perf_counter() - started
        _write_step_log(args.step_log, f"calibration{len(self.traces)}", trace)
        self.traces.append(trace)

    def fit(self) -> dict[str, Any]:
        """Fit the segments' steps; save the profile; LogFitRefused for a log too thin."""
        args = self.args
        name, base = f"{args.hardware}-served", get_hardware(args.hardware)
        steps = [step for trace in self.traces for step in served_steps(trace)]
        fit = fit_step_log(steps, self.model_and_executor[1].spec, base, name,
                           serial_below_tokens=base.serial_below_tokens,
                           source="fidelity.py served load")
        # the setup of a step size new to the engine stays the sweep's (the simulator
        # warms the sizes the engine ran, as the real engine keeps them)
        save_hardware(dataclasses.replace(fit.hardware, new_size_fixed=base.new_size_fixed,
                                          new_size_per_token=base.new_size_per_token,
                                          new_size_cache=base.new_size_cache))
        args.hardware = name
        return {"profile": name, "fit_error": round(fit.error, 4),
                "num_steps": fit.num_steps, "segments": len(self.traces),
                "by_kind": {k: dataclasses.asdict(v) for k, v in fit.by_kind.items()},
                "by_threads": {k: dataclasses.asdict(v) for k, v in fit.by_threads.items()},
                "idle_wake_ms": round(fit.hardware.idle_wake * 1e3, 2),
                "prefill_factors": list(fit.hardware.prefill_factors),
                "decode_factors": list(fit.hardware.decode_factors),
                "loop_median_ms": [t.summary().get("loop_median_ms") for t in self.traces],
                "wall_s": round(self.wall_s, 1), "outside_cpu": self.outside}


class CpuTimed:
    """An executor whose steps report process CPU time as their duration (`--cpu-time`)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute(self, batch: Any) -> Any:
        started = time.process_time()
        result = self._inner.execute(batch)
        return dataclasses.replace(result, duration=time.process_time() - started)


class SizeRecorder:
    """An executor that records the token count of every forward step it runs: the step
    sizes whose primitives the process has built (andante.perf.step_sizes)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute(self, batch: Any) -> Any:
        if batch.requests:
            self.sizes.append(batch.num_tokens)
        return self._inner.execute(batch)


def real_run(args: argparse.Namespace, model_and_executor: tuple[Any, Any],
             workload: list[RequestSpec], config: SchedulerConfig,
             single_fit: CostModel | None = None) -> tuple[Summary, StepTrace]:
    """The workload live on the real engine; its summary and step trace, whose `history`
    is the step sizes the executor had run before the timed requests."""
    from andante.llm import build_offline_engine, run_timed

    model, executor = model_and_executor
    engine = build_offline_engine(model, args.policy, config, executor,
                                  clock=MonotonicClock())
    warm = [Request(f"warm{i}", [1000 + i] * 64, SamplingParams(max_tokens=4, temperature=0,
                                                                ignore_eos=True), 0.0)
            for i in range(2)]
    for req in warm:
        engine.add_request(req)
    while engine.has_work:
        engine.step()
    rng = np.random.default_rng(args.seed)
    start = engine.clock.now() + 0.5
    requests = [
        Request(f"r{i}", rng.integers(1000, 40000, spec.prompt_len).tolist(),
                SamplingParams(max_tokens=spec.output_len, temperature=0.0, ignore_eos=True),
                start + spec.arrival_time)
        for i, spec in enumerate(workload)
    ]
    history = tuple(executor.sizes)
    trace = StepTrace(CostModel(executor.spec, get_hardware(args.hardware)), engine.clock,
                      single_fit, wall_loop=not args.cpu_time, history=history)
    engine.add_observer(trace)
    run_timed(engine, requests)
    return summarize(records_from_requests(requests)), trace


def sim_run(args: argparse.Namespace, workload: list[RequestSpec], config: SchedulerConfig,
            history: tuple[int, ...] = ()) -> Summary:
    """The workload in the simulator, its instance having run the step sizes `history`."""
    spec = ClusterSpec(model="smollm2-135m", hardware=args.hardware, policy=args.policy,
                       scheduler=config)
    simulator = build_simulator(spec)
    for instance in simulator.instances:
        instance.engine.executor.step_sizes.warm(history)
    requests = to_requests(workload)
    simulator.run(requests)
    return summarize(records_from_requests(requests))


def _figures(summary: Summary) -> dict[str, float]:
    return {"ttft_mean_ms": round(summary.ttft.mean * 1e3, 2),
            "tpot_mean_ms": round(summary.tpot.mean * 1e3, 2),
            "ttft_median_ms": round(summary.ttft.median * 1e3, 2),
            "tpot_median_ms": round(summary.tpot.median * 1e3, 2),
            "num_finished": summary.num_finished}


def _errors(real: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    return {f"{m}_error": round(abs(sim[f"{m}_mean_ms"] - real[f"{m}_mean_ms"])
                                / real[f"{m}_mean_ms"], 4) for m in ("ttft", "tpot")}


def _calibrate(args: argparse.Namespace, executor: Any) -> tuple[dict[str, Any], CostModel]:
    """Fit the profile `args.hardware` into a private profiles folder (ANDANTE_HOME);
    also the one-set fit of the same steps (the cost model before step kinds)."""
    from andante.cli.calibrate import save_fit
    from andante.exec.torch_calibrate import calibrate

    os.environ[ANDANTE_HOME_ENV] = tempfile.mkdtemp(prefix="andante-fidelity-")
    started, outside = time.perf_counter(), OutsideCpu()
    result = calibrate(executor, name=args.hardware)
    outside_share = outside.share()
    save_fit(result.hardware, result.error, force=True)
    base = CostModel(executor.spec, dataclasses.replace(result.hardware,
                                                        serial_coefficients=None,
                                                        serial_below_tokens=None))
    single = base.with_coefficients(fit_coefficients(base, result.samples))
    hw = result.hardware
    return {"fit_error": round(result.error, 4), "num_samples": len(result.samples),
            "new_size_ms": [round(hw.new_size_fixed * 1e3, 3),
                            round(hw.new_size_per_token * 1e3, 5)],
            "new_size_cache": hw.new_size_cache,
            "single_fit_error": round(prediction_error(single, result.samples), 4),
            "wall_s": round(time.perf_counter() - started, 1),
            "outside_cpu": outside_share}, single


def _write_step_log(path: str | None, rate: float | str, trace: StepTrace) -> None:
    if path is None:
        return
    with open(path, "a", encoding="utf-8") as out:
        for row in trace.rows:
            out.write(json.dumps({"rate": rate, **row}) + "\n")


class OutsideCpu:
    """The CPU time other processes used while this one ran a phase, as a share of the
    machine (/proc/stat's busy time less this process's own, over wall time and cores):
    a figure that tells an outside load from the engine's own drift (None where
    /proc/stat is missing)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as stat:
                ticks = [int(v) for v in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        own = os.times()
        return busy, own.user + own.system, time.perf_counter()

    def share(self) -> float | None:
        end = self._read()
        if end is None or self._start is None or end[2] <= self._start[2]:
            return None
        outside = (end[0] - self._start[0]) - (end[1] - self._start[1])
        cores = os.cpu_count() or 1
        return round(max(0.0, outside) / ((end[2] - self._start[2]) * cores), 4)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _real_rate(args: argparse.Namespace, model_and_executor: tuple[Any, Any], rate: float,
               config: SchedulerConfig, single_fit: CostModel | None
               ) -> tuple[list[RequestSpec], dict[str, Any], StepTrace]:
    """The real run of one Poisson rate: its workload, figures and step trace."""
    workload = build_workload(WorkloadConfig(kind="poisson", rate=rate,
                                             num_requests=args.num_requests,
                                             lengths=args.lengths, seed=args.seed))
    outside = OutsideCpu()
    real_summary, trace = real_run(args, model_and_executor, workload, config, single_fit)
    _write_step_log(args.step_log, rate, trace)
    return workload, {"rate": rate, "real": _figures(real_summary), "loadavg": _loadavg(),
                      "outside_cpu": outside.share()}, trace


def _sim_rate(args: argparse.Namespace, workload: list[RequestSpec], config: SchedulerConfig,
              run: dict[str, Any], trace: StepTrace) -> dict[str, Any]:
    """The simulated run of a rate that ran for real, its errors, and the real steps
    against the profile the simulator uses."""
    sim = _figures(sim_run(args, workload, config, trace.history))
    trace.repredict(CostModel(trace.cost_model.model, get_hardware(args.hardware)))
    return {**run, "sim": sim, **_errors(run["real"], sim), "steps": trace.summary()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0.5,1,2", help="requests/s (Poisson), comma-separated")
    p.add_argument("--num-requests", type=int, default=30, help="per rate")
    p.add_argument("--lengths", default="uniform:32:256:16:96")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="vllm")
    p.add_argument("--hardware", default="cpu", help="the profile the simulator uses")
    p.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True,
                   help="calibrate first (default; into a private profiles folder)")
    p.add_argument("--prefix-caching", default="both", metavar="MODES",
                   help="the engine's prefix caching on both sides: on, off, both (default: "
                   "every rate with it off, then on) or phases in order, e.g. on,off,on")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--cpu-time", action="store_true",
                   help="time steps in process CPU time (needs --threads 1): per-step "
                   "ratios that a busy machine barely moves")
    p.add_argument("--calibrate-from-load", action="store_true",
                   help="fit the simulator's profile to the steps the real engine served "
                   "under a calibration load (forward pass plus loop time: what a served "
                   "token pays) instead of the sweep's forward passes alone")
    p.add_argument("--calibration-rate", type=float, default=2.0)
    p.add_argument("--calibration-requests", type=int, default=60)
    p.add_argument("--calibration-lengths", default="uniform:16:512:8:96")
    p.add_argument("--interleave-requests", type=int, default=24,
                   help="with --calibrate-from-load: a calibration segment of this many "
                   "requests after each real run, fitted with the first (0: none)")
    p.add_argument("--step-log", default=None,
                   help="write every real step (shape, measured, predicted) as JSON lines")
    args = p.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",")]
        phases = [(mode, scheduler_config(mode)) for mode in caching_phases(args.prefix_caching)]
        if args.cpu_time and args.threads != 1:
            raise ValueError("--cpu-time needs --threads 1 (CPU time sums the threads)")
    except ValueError as exc:
        print(f"fidelity.py: error: {exc}", file=sys.stderr)
        return 2
    load_before, started = _loadavg(), time.perf_counter()
    model, executor = _executor(args)
    model_and_executor = (model, SizeRecorder(CpuTimed(executor) if args.cpu_time
                                              else executor))
    with executor.unbucketed():
        calibration, single_fit = (_calibrate(args, model_and_executor[1]) if args.calibrate
                                   else (None, None))
    warmup = _warm_buckets(executor)
    served = (ServedCalibration(args, model_and_executor, phases[0][1])
              if args.calibrate_from_load else None)
    if served is not None:
        if not args.calibrate:  # the private profiles folder the sweep would have made
            os.environ[ANDANTE_HOME_ENV] = tempfile.mkdtemp(prefix="andante-fidelity-")
        served.segment(args.calibration_requests)
    real_runs = []
    for mode, config in phases:
        for rate in rates:
            workload, run, trace = _real_rate(args, model_and_executor, rate, config,
                                              single_fit)
            real_runs.append((mode, config, workload, run, trace))
            print(f"prefix caching {mode}, rate {rate}: {json.dumps(run)}",
                  file=sys.stderr, flush=True)
            if served is not None and args.interleave_requests:
                served.segment(args.interleave_requests)
    served_fit = None
    if served is not None:
        try:
            served_fit = served.fit()
        except LogFitRefused as exc:  # a busy machine's stalls: say so, no traceback
            print(f"fidelity.py: error: the served calibration load's steps: {exc}",
                  file=sys.stderr)
            return 2
    runs = [{"prefix_caching": mode, **_sim_rate(args, workload, config, run, trace)}
            for mode, config, workload, run, trace in real_runs]
    worst = max(max(r["ttft_error"], r["tpot_error"]) for r in runs)
    print(json.dumps({
        "benchmark": "fidelity", "workload": {
            "kind": "poisson", "num_requests": args.num_requests, "lengths": args.lengths,
            "seed": args.seed}, "policy": args.policy, "prefix_caching": args.prefix_caching,
        "threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "cpu_time": args.cpu_time,
        "calibration": calibration, "served_calibration": served_fit,
        "bucket_warmup": warmup, "runs": runs,
        "worst_error": worst, "target": TARGET,
        "within_target": worst <= TARGET, "wall_s": round(time.perf_counter() - started, 1),
        "loadavg_before": load_before, "loadavg_after": _loadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
