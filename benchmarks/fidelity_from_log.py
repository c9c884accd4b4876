"""Simulator fidelity from a served engine's own step log: calibrate, then predict it.

The check of issue 31 item 2, for whichever engine serves: `--engine andante`
(`andante serve --trace-steps FILE`) or `--engine vllm` (vLLM CPU running andante's
scheduler class, which writes the same step log when `{"andante": {"step_log": PATH}}`
is in its `--additional-config`). One server, started once, serves segments, each a
range of the step log's lines:

1. calibration: a Poisson workload of varied lengths (`--calibration-*`), then a light
   one of short outputs (`--calibration-idle-*`) where most requests find the engine
   idle, for the fit of the engine's wake-up (andante.perf.idle_wake);
2. runs: for each rate of `--rates` (default 0.5, 1, 2 req/s), a Poisson workload
   (other seeds than the calibration's) replayed by andante's load generator (token-id
   prompts of exact length, ignore_eos, streaming); each run followed by a short
   calibration segment (`--interleave-requests`, the calibration load's rate and
   lengths); `--passes` (2 by default) repeats the rates, every other pass in reverse
   order.
Then every calibration segment, and nothing of the runs, is fitted by `andante
calibrate --step-log` (--base-hardware cpu, into a private profiles folder), and each
run's workload simulated by `andante simulate`'s engine (`andante.sim`, policy vllm, the
server's limits) on the fitted profile. Target: per rate, mean TTFT and mean TPOT
within 10% (|sim - real| / real; the means over its passes).

Drift (design). The machine's speed moves over minutes (a shared 2-core machine:
in two of issue 31's quiet runs, one rate's window had decode steps 6-17% and steps
with a prefill 24-36% slower than the calibration before it predicted, the other rates'
windows of the same run within a few percent). Fitting only a calibration done first bets
on the machine's speed then; the segments interleaved with the runs spread the fitted
steps over the whole benchmark, so the fit stands for its mean speed, while the
predicted requests stay out of the fit (their own steps would be an answer key). A
slowdown inside one run's 30-60 s window is not seen by any held-out segment: passes
(two by default) average such windows out, and each run's figures are reported apart.

The real TTFT is the client's (HTTP and streaming included); the simulator's is the
engine's plus the front end's time the log measured (the step log's request records,
and the HTTP timing middleware's: andante.perf.frontend_log), which the fitted profile
carries as `frontend_in` and `frontend_out`, plus the client's own time, which no
server log sees: the calibration segments' client TTFT less the server's (HTTP receipt
to first byte) for the same requests, added to `frontend_in` (`client_overhead`; 4-5 ms
in most recorded runs here, up to 10). Each run also reports the simulation without any front end
(`sim_without_frontend`) and without the engine's idle wake (`sim_without_wake`: the
same log fitted without its idle gaps), and its TTFT taken apart, real and simulated
(`ttft_parts_ms`, benchmarks/fidelity_decompose.py). A served andante step costs its
forward pass plus the server's overhead between steps (the trace's `overhead`), which
the fit adds (andante.perf.step_log). `--replay DIR` serves nothing: it analyses a
recorded `--log-dir` (its out.json is this script's JSON line; a log recorded before
segments were, as its calibration file and then one run per rate). Prints one JSON
line: the fit (error per step kind, steps, shapes, front end, wake, prefill factors),
per run and per rate the real and simulated figures and their errors, the worst error,
the segments, the load average before and after (the machine's load moves the real
figures: say so when reporting).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
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
from fidelity_decompose import decomposition, real_requests, simulated_parts  # noqa: E402
from peer_paths import REPO, VLLM_MODEL, VLLM_PYTHON  # noqa: E402
from serve_vs_vllm import free_port, start, stop, warm_up  # noqa: E402

TARGET = 0.10
PROFILE = "served"
BARE_PROFILE = "served-without-frontend"  # the same steps, no front end (for comparison)
WAKELESS_PROFILE = "served-without-wake"  # the log fitted without its idle gaps
FIT_FIELDS = ("fit_error", "num_steps", "num_shapes", "by_kind", "engines", "fitted_on",
              "frontend_in", "frontend_out", "num_request_records", "num_matched_http",
              "frontend_note", "idle_wake", "idle_wake_after", "idle_wake_note",
              "num_idle_steps", "num_woken_steps", "prefill_factors", "decode_factors",
              "client_overhead")


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


def served(port: int, config: WorkloadConfig) -> tuple[dict[str, float], float]:
    """The workload replayed on the server: (its figures, the sum of its TTFTs, s)."""
    cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}", seed=config.seed)
    run = asyncio.run(run_bench(build_workload(config), cfg))
    if run.errors:
        raise RuntimeError(f"{len(run.errors)} requests failed: {run.errors[:3]}")
    ttfts = [r.token_times[0] - r.arrival_time for r in run.records if r.token_times]
    return figures(run.summary), sum(ttfts)


def simulated(args: argparse.Namespace, config: WorkloadConfig,
              profile: str = PROFILE) -> tuple[dict[str, float], list[Any]]:
    """(figures, the simulated requests) of `config` on `profile`."""
    spec = ClusterSpec(model="smollm2-135m", hardware=profile, policy="vllm",
                       scheduler=engine_limits(args))
    requests = to_requests(build_workload(config))
    simulator = build_simulator(spec)
    simulator.run(requests)
    return (figures(summarize(records_from_requests(requests, simulator.delivery_delay))),
            requests)


def _errors(sim: dict[str, float], real: dict[str, float]) -> dict[str, float]:
    return {f"{m}_error": round(abs(sim[f"{m}_mean_ms"] - real[f"{m}_mean_ms"])
                                / real[f"{m}_mean_ms"], 4) for m in ("ttft", "tpot")}


def figures(summary: Any) -> dict[str, float]:
    return {"ttft_mean_ms": round(summary.ttft.mean * 1e3, 2),
            "tpot_mean_ms": round(summary.tpot.mean * 1e3, 2),
            "num_finished": summary.num_finished}


def _is_step(line: str) -> bool:
    """A step record of the log, however its JSON is spaced."""
    if '"step"' not in line:
        return False
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("kind") == "step"


def calibration_lines(lines: list[str], segments: list[dict[str, Any]]) -> list[str]:
    """The calibration segments' lines, one after another; each later segment's first
    step loses its end time, so that the gap over the runs between two segments does not
    pass for an idle engine (andante.perf.step_log: no `t`, no idle gap)."""
    out: list[str] = []
    for segment in (s for s in segments if s["kind"] == "calibration"):
        part = lines[segment["lines"][0]:segment["lines"][1]]
        if out:
            first = next((i for i, line in enumerate(part) if _is_step(line)), None)
            if first is not None:
                record = json.loads(part[first])
                record.pop("t", None)
                part = [*part[:first], json.dumps(record) + "\n", *part[first + 1:]]
        out += part
    return out


def client_overhead(lines: list[str], segments: list[dict[str, Any]]) -> float | None:
    """Seconds the client's TTFT exceeds the server's (HTTP receipt to first byte), over
    the calibration segments' requests: the time a server's log cannot see (the client's
    send and read, the HTTP server before the middleware). None without the figures."""
    client, server, count = 0.0, 0.0, 0
    for segment in (s for s in segments if s["kind"] == "calibration"):
        real = real_requests(lines[segment["lines"][0]:segment["lines"][1]])
        if segment.get("client_ttft_sum") is None or not real:
            continue
        client += segment["client_ttft_sum"]
        server += sum(r.ttft for r in real)
        count += len(real)
    if not count:
        return None
    return max(0.0, (client - server) / count)


def calibrate(lines: list[str], segments: list[dict[str, Any]], out: Path,
              args_client: float | None = None) -> dict[str, Any]:
    """Fit the calibration segments of the log as PROFILE (with the client's overhead
    added to its front end in), and the comparison profiles."""
    out.write_text("".join(calibration_lines(lines, segments)), encoding="utf-8")
    argv = ["calibrate", "--step-log", str(out), "--model", "smollm2-135m",
            "--base-hardware", "cpu", "--name", PROFILE, "--force", "--json"]
    saved = Path(os.environ[ANDANTE_HOME_ENV]) / "hardware"
    buffer = StringIO()
    with redirect_stdout(buffer):
        code = andante_main(argv)
    if code != 0 or not (saved / f"{PROFILE}.json").is_file():
        raise RuntimeError(f"calibration failed (exit {code}): {buffer.getvalue()}")
    fit = json.loads(buffer.getvalue())
    client = client_overhead(lines, segments)
    if client is None and args_client is not None:  # --client-overhead-ms (replays)
        client = args_client / 1e3
    fit["client_overhead"] = client
    served = get_hardware(PROFILE)
    served = dataclasses.replace(served, frontend_in=served.frontend_in + (client or 0.0))
    save_hardware(served)
    save_hardware(dataclasses.replace(served, name=BARE_PROFILE, frontend_in=0.0,
                                      frontend_out=0.0))
    save_wakeless(out, served)
    return fit


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


def run_workload(args: argparse.Namespace, segment: dict[str, Any]) -> WorkloadConfig:
    """The run segment's workload (its own lengths and size where it recorded them)."""
    return workload(args, segment["rate"], segment["seed"],
                    segment.get("lengths", args.lengths),
                    segment.get("num_requests", args.num_requests))


def predict(args: argparse.Namespace, lines: list[str], segments: list[dict[str, Any]]
            ) -> dict[str, Any]:
    """Fit the calibration segments; simulate every run segment (never fitted on)."""
    folder = Path(os.environ[ANDANTE_HOME_ENV]) if args.replay else args.log_dir
    fit = calibrate(lines, segments, folder / f"{args.engine}-calibration.jsonl",
                    args.client_overhead_ms)
    frontend_out = get_hardware(PROFILE).frontend_out
    runs = []
    for segment in (s for s in segments if s["kind"] == "run"):
        config, real = run_workload(args, segment), segment["real"]
        sim, requests = simulated(args, config)
        wakeless = simulated(args, config, WAKELESS_PROFILE)[0]
        parts = decomposition(real_requests(lines[segment["lines"][0]:segment["lines"][1]]),
                              simulated_parts(requests, frontend_out),
                              real["ttft_mean_ms"])
        runs.append({"rate": segment["rate"], "pass": segment["pass"], "real": real,
                     "sim": sim, **_errors(sim, real),
                     "sim_without_frontend": simulated(args, config, BARE_PROFILE)[0],
                     "sim_without_wake": wakeless,
                     "without_wake_errors": _errors(wakeless, real),
                     "ttft_parts_ms": parts, "loadavg": segment.get("loadavg")})
    return {"fit": {k: fit.get(k) for k in FIT_FIELDS}, "runs": runs,
            "by_rate": by_rate(runs)}


def by_rate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate, the real and simulated means over its passes, and their errors."""
    out = []
    for rate in sorted({r["rate"] for r in runs}):
        mine = [r for r in runs if r["rate"] == rate]
        real = {k: round(statistics.fmean(r["real"][k] for r in mine), 2)
                for k in ("ttft_mean_ms", "tpot_mean_ms")}
        sim = {k: round(statistics.fmean(r["sim"][k] for r in mine), 2)
               for k in ("ttft_mean_ms", "tpot_mean_ms")}
        out.append({"rate": rate, "passes": len(mine), "real": real, "sim": sim,
                    **_errors(sim, real)})
    return out


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
    p.add_argument("--passes", type=int, default=2,
                   help="passes over the rates (every other one in reverse order); each "
                   "rate's figures are the means over its passes (one 30-request window "
                   "per rate is at the mercy of the machine's speed in those seconds)")
    p.add_argument("--interleave-requests", type=int, default=24,
                   help="requests of a short calibration segment (the calibration "
                   "load's rate and lengths) after each run (0: none): the fit sees the "
                   "machine's speed over the whole benchmark, never the runs' requests")
    p.add_argument("--replay", type=Path, default=None, metavar="DIR",
                   help="serve nothing: analyse a recorded run's --log-dir (its step "
                   "log, calibration file and out.json, the JSON this script printed)")
    p.add_argument("--client-overhead-ms", type=float, default=None,
                   help="the client's own TTFT share where the log's calibration has no "
                   "client figures (a replay of a log recorded before they were): e.g. "
                   "what other runs measured")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--model-dir", type=Path, default=VLLM_MODEL)
    p.add_argument("--vllm-python", default=str(VLLM_PYTHON))
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--log-dir", type=Path, default=Path("runs/fidelity_from_log"))
    return p.parse_args(argv)


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def serve_segments(args: argparse.Namespace, port: int, step_log: Path
                   ) -> list[dict[str, Any]]:
    """Serve the calibration load, then each pass over the rates (each run followed by a
    short calibration segment where --interleave-requests > 0); each segment's lines of
    the step log, real figures and seed."""
    segments: list[dict[str, Any]] = []

    def segment(kind: str, config: WorkloadConfig, **extra: Any) -> None:
        first = _line_count(step_log)
        real, ttft_sum = served(port, config)
        segments.append({"kind": kind, "lines": [first, _line_count(step_log)],
                         "seed": config.seed, "rate": config.rate,
                         "num_requests": config.num_requests, "lengths": config.lengths,
                         "real": real,
                         "client_ttft_sum": ttft_sum,
                         "loadavg": [round(x, 2) for x in os.getloadavg()], **extra})
        print(json.dumps({k: v for k, v in segments[-1].items() if k != "lines"}),
              file=sys.stderr, flush=True)

    segment("calibration", workload(args, args.calibration_rate, args.seed + 100,
                                    args.calibration_lengths, args.calibration_requests))
    if args.calibration_idle_requests:
        segment("calibration", workload(args, args.calibration_idle_rate, args.seed + 200,
                                        args.calibration_idle_lengths,
                                        args.calibration_idle_requests))
    rates = [float(r) for r in args.rates.split(",")]
    for number in range(args.passes):
        order = list(enumerate(rates)) if number % 2 == 0 else list(enumerate(rates))[::-1]
        for index, rate in order:
            segment("run", workload(args, rate, args.seed + index + 1000 * number,
                                    args.lengths, args.num_requests), **{"pass": number})
            if args.interleave_requests:
                segment("calibration", workload(
                    args, args.calibration_rate, args.seed + 300 + len(segments),
                    args.calibration_lengths, args.interleave_requests))
    return segments


def recorded_segments(args: argparse.Namespace, lines: list[str]) -> list[dict[str, Any]]:
    """A recorded run's segments (--replay): its out.json's, or, for a log written
    before segments were recorded, the calibration file's lines and then one run per
    rate of out.json, --num-requests requests each, seeds --seed + index."""
    out = json.loads((args.replay / "out.json").read_text(encoding="utf-8"))
    if out.get("segments"):
        return list(out["segments"])
    calibration = _line_count(args.replay / f"{args.engine}-calibration.jsonl")
    segments: list[dict[str, Any]] = [{"kind": "calibration", "lines": [0, calibration]}]
    # a run starts at its first request's first record: vLLM's request record (written
    # at the first token, before the HTTP one), andante's HTTP record (its request
    # record is written at the end)
    kind = '"kind": "http"' if any('"first_scheduled"' in line for line in lines) \
        else '"kind": "request"'
    requests = [i for i, line in enumerate(lines) if i >= calibration and kind in line]
    starts = requests[::args.num_requests]
    if len(starts) != len(out["runs"]):
        raise SystemExit(f"{args.replay}: {len(requests)} request records after the "
                         f"calibration do not make {len(out['runs'])} runs of "
                         f"{args.num_requests}: a log without request records cannot be "
                         "replayed")
    bounds = [calibration, *starts[1:], len(lines)]
    for index, run in enumerate(out["runs"]):
        segments.append({"kind": "run", "lines": [bounds[index], bounds[index + 1]],
                         "rate": run["rate"], "seed": args.seed + index, "pass": 0,
                         "real": run["real"], "loadavg": run.get("loadavg")})
    return segments


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ[ANDANTE_HOME_ENV] = tempfile.mkdtemp(prefix="andante-fidelity-log-")
    if args.replay is not None:  # the recorded folder is only read
        step_log = args.replay / f"{args.engine}-steps.jsonl"
        lines = step_log.read_text(encoding="utf-8").splitlines(keepends=True)
        segments = recorded_segments(args, lines)
        load_before = load_after = None
        wall = 0.0
    else:
        segments, step_log, load_before, load_after, wall = serve(args)
        lines = step_log.read_text(encoding="utf-8").splitlines(keepends=True)
    result = predict(args, lines, segments)
    worst = max(max(r["ttft_error"], r["tpot_error"]) for r in result["by_rate"])
    print(json.dumps({"benchmark": "fidelity_from_log", "engine": args.engine,
                      "replay": str(args.replay) if args.replay else None, **result,
                      "worst_error": worst, "target": TARGET,
                      "within_target": worst <= TARGET, "step_log": str(step_log),
                      "wall_s": wall, "loadavg_before": load_before,
                      "loadavg_after": load_after, "segments": segments}))
    return 0


def serve(args: argparse.Namespace
          ) -> tuple[list[dict[str, Any]], Path, list[float], list[float], float]:
    """Serve every segment on one server; (segments, the step log, load average before
    and after, wall seconds)."""
    args.log_dir.mkdir(parents=True, exist_ok=True)
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
        segments = serve_segments(args, port, step_log)
    finally:
        stop(proc)
    return (segments, step_log, load_before, [round(x, 2) for x in os.getloadavg()],
            round(time.perf_counter() - started, 1))


if __name__ == "__main__":
    sys.exit(main())
