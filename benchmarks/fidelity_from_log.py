"""Simulator fidelity from a served engine's own step log: calibrate, then predict it.

The check of issue 31 item 2, for whichever engine serves: `--engine andante`
(`andante serve --trace-steps FILE`) or `--engine vllm` (vLLM CPU running andante's
scheduler class, which writes the same step log when `{"andante": {"step_log": PATH}}`
is in its `--additional-config`). One server, started once:

1. calibration load: a Poisson workload of varied lengths (`--calibration-*`), then a
   light one of short outputs (`--calibration-idle-*`) where most requests find the
   engine idle, for the fit of the engine's wake-up
   (andante.perf.idle_wake); its steps logged; the log up to its end is fitted by
   `andante calibrate --step-log` (--base-hardware cpu, into a private profiles folder);
2. for each rate of `--rates` (default 0.5, 1, 2 req/s): a Poisson workload (other
   seeds than the calibration's) replayed on the server by andante's load generator
   (token-id prompts of exact length, ignore_eos, streaming), and the same workload in
   `andante simulate`'s engine (`andante.sim`, policy vllm, the server's limits) on the
   fitted profile. Target: mean TTFT and mean TPOT within 10% (|sim - real| / real).

The real TTFT is the client's (HTTP and streaming included); the simulator's is the
engine's plus the front end's time the log measured (the step log's request records,
and the HTTP timing middleware's: andante.perf.frontend_log), which the fitted profile
carries as `frontend_in` and `frontend_out`; each run also reports the simulation
without it (`sim_without_frontend`), and without the engine's idle wake
(`sim_without_wake`: the same log fitted without its idle gaps, as before the wake was
modelled). A served andante step costs its forward
pass plus the server's overhead between steps (the trace's `overhead`), which the fit
adds (andante.perf.step_log). Prints one JSON line: the fit (error per step kind,
steps, shapes, front end), per rate the real and simulated figures and their errors,
the worst error, the load average before and after (the machine's load moves the real
figures: say so when reporting).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

from andante.bench.load import BenchConfig, run_bench
from andante.cli.main import main as andante_main
from andante.exec.torch_cost import cpu_hardware
from andante.metrics.record import records_from_requests
from andante.metrics.summary import summarize
from andante.perf.catalog import get_hardware, get_model, save_hardware
from andante.perf.log_fit import fit_step_log
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.specs import HardwareSpec
from andante.perf.step_log import read_step_log
from andante.policies import SchedulerConfig
from andante.server.http_timing import LOG_ENV as HTTP_LOG_ENV
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload
from andante.workload.spec import to_requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_paths import REPO, VLLM_MODEL, VLLM_PYTHON  # noqa: E402
from serve_vs_vllm import free_port, start, stop, warm_up  # noqa: E402

TARGET = 0.10
PROFILE = "served"
BARE_PROFILE = "served-without-frontend"  # the same steps, no front end (for comparison)
WAKELESS_PROFILE = "served-without-wake"  # the log fitted without its idle gaps
FIT_FIELDS = ("fit_error", "num_steps", "num_shapes", "by_kind", "engines", "fitted_on",
              "frontend_in", "frontend_out", "num_request_records", "num_matched_http",
              "frontend_note", "idle_wake", "idle_wake_after", "idle_wake_note",
              "num_idle_steps", "num_woken_steps")


def server_command(args: argparse.Namespace, port: int, step_log: Path) -> list[str]:
    limits = ["--max-model-len", str(args.max_model_len), "--max-num-seqs",
              str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_batched_tokens)]
    if args.engine == "andante":
        return [sys.executable, "-m", "andante.cli.main", "serve", "--port", str(port),
                "--policy", "vllm", "--log-level", "warning", "--no-prefix-caching",
                "--dtype", "bfloat16", "--trace-steps", str(step_log), *limits]
    config = {"andante": {"policy": "vllm", "step_log": str(step_log)}}
    return [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(args.model_dir), "--served-model-name", "smollm2", "--dtype", "bfloat16",
            "--host", "127.0.0.1", "--port", str(port), "--no-enable-prefix-caching",
            "--enforce-eager", "--no-async-scheduling",
            "--scheduler-cls", "andante.vllm.Scheduler",
            "--middleware", "andante.server.http_timing.HttpTiming",
            "--additional-config", json.dumps(config), *limits]


def engine_limits(args: argparse.Namespace) -> SchedulerConfig:
    return SchedulerConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                           max_num_batched_tokens=args.max_batched_tokens)


def served(port: int, config: WorkloadConfig) -> dict[str, float]:
    cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}", seed=config.seed)
    run = asyncio.run(run_bench(build_workload(config), cfg))
    if run.errors:
        raise RuntimeError(f"{len(run.errors)} requests failed: {run.errors[:3]}")
    return figures(run.summary)


def simulated(args: argparse.Namespace, config: WorkloadConfig,
              profile: str = PROFILE) -> dict[str, float]:
    spec = ClusterSpec(model="smollm2-135m", hardware=profile, policy="vllm",
                       scheduler=engine_limits(args))
    requests = to_requests(build_workload(config))
    simulator = build_simulator(spec)
    simulator.run(requests)
    return figures(summarize(records_from_requests(requests, simulator.delivery_delay)))


def _errors(sim: dict[str, float], real: dict[str, float]) -> dict[str, float]:
    return {f"{m}_error": round(abs(sim[f"{m}_mean_ms"] - real[f"{m}_mean_ms"])
                                / real[f"{m}_mean_ms"], 4) for m in ("ttft", "tpot")}


def figures(summary: Any) -> dict[str, float]:
    return {"ttft_mean_ms": round(summary.ttft.mean * 1e3, 2),
            "tpot_mean_ms": round(summary.tpot.mean * 1e3, 2),
            "num_finished": summary.num_finished}


def calibrate(step_log: Path, upto: int, out: Path) -> dict[str, Any]:
    """Fit the first `upto` lines of the log (the calibration load) as PROFILE."""
    lines = step_log.read_text(encoding="utf-8").splitlines(keepends=True)[:upto]
    out.write_text("".join(lines), encoding="utf-8")
    argv = ["calibrate", "--step-log", str(out), "--model", "smollm2-135m",
            "--base-hardware", "cpu", "--name", PROFILE, "--force", "--json"]
    saved = Path(os.environ[ANDANTE_HOME_ENV]) / "hardware"
    buffer = StringIO()
    with redirect_stdout(buffer):
        code = andante_main(argv)
    if code != 0 or not (saved / f"{PROFILE}.json").is_file():
        raise RuntimeError(f"calibration failed (exit {code}): {buffer.getvalue()}")
    served = get_hardware(PROFILE)
    save_hardware(dataclasses.replace(served, name=BARE_PROFILE, frontend_in=0.0,
                                      frontend_out=0.0))
    save_wakeless(out, served)
    return json.loads(buffer.getvalue())


def save_wakeless(log: Path, served: HardwareSpec) -> None:
    """WAKELESS_PROFILE: `log` fitted as if its steps had no idle gaps (so no wake, and
    coefficients fitted to every step as it was measured), with `served`'s front end."""
    steps = [dataclasses.replace(s, idle_before=None) for s in read_step_log(log)]
    fit = fit_step_log(steps, get_model("smollm2-135m"), cpu_hardware()[0], WAKELESS_PROFILE)
    save_hardware(dataclasses.replace(fit.hardware, frontend_in=served.frontend_in,
                                      frontend_out=served.frontend_out))


def workload(args: argparse.Namespace, rate: float, seed: int, lengths: str,
             num_requests: int) -> WorkloadConfig:
    return WorkloadConfig(kind="poisson", rate=rate, num_requests=num_requests,
                          lengths=lengths, seed=seed)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["andante", "vllm"], default="andante")
    p.add_argument("--rates", default="0.5,1,2", help="requests/s (Poisson), comma-separated")
    p.add_argument("--num-requests", type=int, default=30, help="per rate")
    p.add_argument("--lengths", default="uniform:32:256:16:96")
    p.add_argument("--calibration-rate", type=float, default=2.0)
    p.add_argument("--calibration-requests", type=int, default=80)
    p.add_argument("--calibration-lengths", default="uniform:16:512:8:96")
    p.add_argument("--calibration-idle-rate", type=float, default=0.5,
                   help="requests/s of the light calibration load (idle gaps: the wake)")
    p.add_argument("--calibration-idle-requests", type=int, default=24,
                   help="requests of the light calibration load (0: none)")
    p.add_argument("--calibration-idle-lengths", default="uniform:16:512:4:8",
                   help="its lengths: short outputs, so that most requests find the "
                   "engine idle and the log is not swamped by alike one-sequence decodes "
                   "(they drag the fit's work-duration rank check under its bound)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--model-dir", type=Path, default=VLLM_MODEL)
    p.add_argument("--vllm-python", default=str(VLLM_PYTHON))
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--log-dir", type=Path, default=Path("runs/fidelity_from_log"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    os.environ[ANDANTE_HOME_ENV] = tempfile.mkdtemp(prefix="andante-fidelity-log-")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])  # andante for vLLM
    step_log = args.log_dir / f"{args.engine}-steps.jsonl"
    step_log.unlink(missing_ok=True)  # vLLM appends: a new run starts a new log
    os.environ[HTTP_LOG_ENV] = str(step_log)  # vLLM's HTTP timing middleware writes there
    load_before, started = [round(x, 2) for x in os.getloadavg()], time.perf_counter()
    port = free_port()
    proc = start(server_command(args, port, step_log), port,
                 args.log_dir / f"{args.engine}.log", args.start_timeout)
    try:
        warm_up(port)
        served(port, workload(args, args.calibration_rate, args.seed + 100,
                              args.calibration_lengths, args.calibration_requests))
        if args.calibration_idle_requests:
            served(port, workload(args, args.calibration_idle_rate, args.seed + 200,
                                  args.calibration_idle_lengths,
                                  args.calibration_idle_requests))
        upto = len(step_log.read_text(encoding="utf-8").splitlines())
        fit = calibrate(step_log, upto, args.log_dir / f"{args.engine}-calibration.jsonl")
        runs = []
        for index, rate in enumerate(rates):
            config = workload(args, rate, args.seed + index, args.lengths, args.num_requests)
            real, sim = served(port, config), simulated(args, config)
            bare = simulated(args, config, BARE_PROFILE)
            wakeless = simulated(args, config, WAKELESS_PROFILE)
            errors = _errors(sim, real)
            runs.append({"rate": rate, "real": real, "sim": sim, **errors,
                         "sim_without_frontend": bare, "sim_without_wake": wakeless,
                         "without_wake_errors": _errors(wakeless, real),
                         "loadavg": [round(x, 2) for x in os.getloadavg()]})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        stop(proc)
    worst = max(max(r["ttft_error"], r["tpot_error"]) for r in runs)
    print(json.dumps({"benchmark": "fidelity_from_log", "engine": args.engine,
                      "fit": {k: fit[k] for k in FIT_FIELDS},
                      "runs": runs, "worst_error": worst, "target": TARGET,
                      "within_target": worst <= TARGET, "step_log": str(step_log),
                      "wall_s": round(time.perf_counter() - started, 1),
                      "loadavg_before": load_before,
                      "loadavg_after": [round(x, 2) for x in os.getloadavg()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
