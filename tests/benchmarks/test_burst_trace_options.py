"""serve_vs_vllm.py --workloads / --trace-dir, and burst_step_overhead.py's replay."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workloads_option_picks_the_burst_alone() -> None:
    serve = _load("serve_vs_vllm")
    assert list(serve.workloads(serve.parse_args([]))) == ["poisson", "burst"]
    assert list(serve.workloads(serve.parse_args(["--workloads", "burst"]))) == ["burst"]
    assert serve.main(["--workloads", "bursty", "--skip-vllm"]) == 2


def test_trace_dir_gives_each_server_run_its_own_file(tmp_path: Path) -> None:
    serve = _load("serve_vs_vllm")
    args = serve.parse_args(["--trace-dir", str(tmp_path)])
    first = serve.andante_command(args, 1, "andes")
    path = Path(first[first.index("--trace-steps") + 1])
    assert path == tmp_path / "andes-0.jsonl"
    path.write_text("")  # the server wrote it
    second = serve.andante_command(args, 2, "andes")
    assert second[second.index("--trace-steps") + 1] == str(tmp_path / "andes-1.jsonl")
    assert "--trace-steps" not in serve.andante_command(serve.parse_args([]), 1, "andes")


def test_burst_overhead_replay_times_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load("burst_step_overhead")
    assert bench.main(["--policy", "andes,vllm", "--hardware", "a10-24g", "--duration", "6",
                       "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    andes, vllm = out["policies"]["andes"], out["policies"]["vllm"]
    assert andes["steps"] > 0 and vllm["steps"] > 0 and andes["median_us"] > 0
    assert andes["ttft_p99_ms"] > 0
    assert bench.main(["--policy", "nope"]) == 2
