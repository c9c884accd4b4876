"""serve_vs_vllm.py --workloads / --trace-dir, and burst_step_overhead.py's replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_workloads_option_picks_the_burst_alone() -> None:
    serve = load_benchmark("serve_vs_vllm")
    assert list(serve.workloads(serve.parse_args([]))) == ["poisson", "burst"]
    assert list(serve.workloads(serve.parse_args(["--workloads", "burst"]))) == ["burst"]
    assert serve.main(["--workloads", "bursty", "--skip-vllm"]) == 2


def test_trace_dir_gives_each_server_run_its_own_file(tmp_path: Path) -> None:
    serve = load_benchmark("serve_vs_vllm")
    args = serve.parse_args(["--trace-dir", str(tmp_path)])
    first = serve.andante_command(args, 1, "andes")
    path = Path(first[first.index("--trace-steps") + 1])
    assert path == tmp_path / "andes-0.jsonl"
    path.write_text("")  # the server wrote it
    second = serve.andante_command(args, 2, "andes")
    assert second[second.index("--trace-steps") + 1] == str(tmp_path / "andes-1.jsonl")
    assert "--trace-steps" not in serve.andante_command(serve.parse_args([]), 1, "andes")


def test_burst_overhead_replay_times_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("burst_step_overhead")
    assert bench.main(["--policy", "andes,vllm", "--hardware", "a10-24g", "--duration", "6",
                       "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    andes, vllm = out["policies"]["andes"], out["policies"]["vllm"]
    assert andes["steps"] > 0 and vllm["steps"] > 0 and andes["median_us"] > 0
    assert andes["ttft_p99_ms"] > 0
    assert bench.main(["--policy", "nope"]) == 2


def test_trace_summary_breaks_the_slowest_request_down(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    summary = load_benchmark("trace_summary")
    records = [
        {"kind": "step", "t": 1.0, "duration": 0.09, "overhead": None, "num_seqs": 1,
         "num_tokens": 1, "prefill_ids": [], "num_waiting": 0},
        {"kind": "step", "t": 1.5, "duration": 0.49, "overhead": 0.01, "num_seqs": 3,
         "num_tokens": 301, "prefill_ids": ["a", "b"], "num_waiting": 0},
        {"kind": "request", "id": "a", "prompt": 200, "output": 4, "arrival": 0.95,
         "seen": 1.002, "first_scheduled": 1.003, "first_token": 1.5, "finish": 2.0,
         "ttft": 0.55, "to_engine": 0.052, "queue": 0.001, "prefill": 0.497,
         "prefill_steps": 1, "prefill_overhead": 0.01, "num_preemptions": 0},
        {"kind": "request", "id": "b", "prompt": 100, "output": 4, "arrival": 1.0,
         "seen": 1.002, "first_scheduled": 1.003, "first_token": 1.5, "finish": 2.0,
         "ttft": 0.5, "to_engine": 0.002, "queue": 0.001, "prefill": 0.497,
         "prefill_steps": 1, "prefill_overhead": 0.01, "num_preemptions": 0},
        {"kind": "gc", "t": 1.7, "generation": 2, "pause": 0.15, "collected": 3},
    ]
    path = tmp_path / "andes-0.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert summary.main([str(path), "--slowest", "1"]) == 0
    (out,) = json.loads(capsys.readouterr().out)["traces"]
    assert out["num_requests"] == 2 and out["num_multi_prompt_steps"] == 1
    assert out["gc_pauses_ms"] == [[2, 150.0]]
    (worst,) = out["slowest"]
    assert worst["id"] == "a" and worst["in_flight_ms"] == 50.0
    assert worst["boundary_ms"] == 2.0 and worst["prompts_in_step"] == 2
    assert summary.main([str(tmp_path / "missing.jsonl")]) == 2
