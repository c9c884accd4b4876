"""benchmarks/gemm_paths.py (and its vLLM half, benchmarks/vllm_peer/onednn_gemm.py): the
cold-weight cycling, bad options refused, and one JSON line per run."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.scripts import load_benchmark
from tests.peers import VllmPeer


def test_cold_cycles_through_copies_past_the_cache() -> None:
    timing = load_benchmark("gemm_timing")
    assert timing.copies_for(1 << 20, cold=False) == 1
    assert timing.copies_for(1 << 20, cold=True) == timing.COLD_BYTES >> 20
    assert timing.copies_for(timing.COLD_BYTES * 2, cold=True) == 1
    seen: list[int] = []
    step = timing.cycling([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        step()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


def test_unknown_shapes_and_paths_are_refused() -> None:
    script = load_benchmark("gemm_paths")
    for bad in (["--shapes", "qkv,nope"], ["--paths", "packed_bf16,fast"]):
        with pytest.raises(SystemExit):
            script.main(bad)


def test_a_run_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_benchmark("gemm_paths")
    assert script.main(["--shapes", "o", "--rows", "1,4", "--threads", "1", "--rounds", "1",
                        "--paths", "packed_bf16,linear_f32"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = record["rows"]
    assert {(r["m"], r["path"]) for r in rows} == {
        (m, p) for m in (1, 4) for p in ("packed_bf16", "linear_f32")}
    assert all(r["shape"] == "o" and r["copies"] == 1 and r["cpu_us"] > 0 for r in rows)


@pytest.mark.slow
def test_vllms_own_gemm_is_timed_in_its_interpreter(
        vllm_peer: VllmPeer, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_benchmark("gemm_paths")
    assert script.main(["--shapes", "o", "--rows", "8", "--threads", "1", "--rounds", "1",
                        "--paths", "packed_bf16", "--vllm",
                        "--vllm-python", str(vllm_peer.python)]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [r["path"] for r in rows] == ["packed_bf16", "vllm_onednn"]
    assert all(r["wall_us"] > 0 for r in rows)
