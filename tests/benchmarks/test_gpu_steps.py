"""benchmarks/gpu_steps.py, the parts that run without a GPU: its options, its shapes
(those of the shared H200 measurement), the step log it writes (a tiny model on the
CPU), and the conversion of the measurement's own format. The GPU run itself (CUDA
graphs, the 8B shape) is not exercised here: no CI machine has a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.perf.shape import BatchShape
from andante.perf.step_log import read_step_log
from tests.benchmarks.scripts import REPO, load_benchmark

gpu_steps = load_benchmark("gpu_steps")
M1 = REPO / "benchmarks" / "data" / "h200-llama-3.1-8b-steps.jsonl"


def test_the_shapes_are_the_measurements():
    measured = read_step_log(M1)
    decodes = [(s.shape.num_seqs, s.shape.kv_tokens_read // s.shape.num_seqs - 1)
               for s in measured if not s.has_prefill]
    prefills = [(s.shape.num_seqs, s.shape.num_tokens // s.shape.num_seqs)
                for s in measured if s.has_prefill]
    assert decodes == list(gpu_steps.DECODE_SHAPES)
    assert prefills == list(gpu_steps.PREFILL_SHAPES)


def test_options_and_their_refusals(capsys):
    args = gpu_steps.parse_args([])
    assert (args.model, args.device, args.time_limit) == ("llama-3.1-8b", "cuda", 270.0)
    with pytest.raises(SystemExit):
        gpu_steps.parse_args(["--time-limit", "0"])
    assert "--time-limit must be > 0" in capsys.readouterr().err


def test_a_cpu_run_of_the_tiny_model_writes_a_step_log(tmp_path: Path, capsys):
    out = tmp_path / "steps.jsonl"
    assert gpu_steps.main(["--device", "cpu", "--model", "tiny", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6 and summary["skipped"] == []
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in records[:2]] == ["setup", "hbm_copy"]
    steps = read_step_log(out)
    assert [s.shape for s in steps[:3]] == [
        BatchShape.decode(b, c) for b, c in gpu_steps.TINY_DECODE_SHAPES]
    assert [s.shape for s in steps[3:]] == [
        BatchShape.prefill(n, b) for b, n in gpu_steps.TINY_PREFILL_SHAPES]
    assert all(s.engine == "torch-sdpa" and s.duration > 0 for s in steps)
    assert all(s.graph is False for s in steps)  # no CUDA graphs on a CPU


def test_a_shape_past_the_time_limit_is_skipped_not_timed(tmp_path: Path):
    import torch

    model = gpu_steps.RandomLlama(gpu_steps.TINY, torch.device("cpu"), torch.bfloat16)
    with (tmp_path / "log.jsonl").open("w") as out:
        written, skipped = gpu_steps.run_shapes(model, ((1, 8),), ((1, 8),), out,
                                                deadline=0.0)
    assert written == 0 and [s["reason"] for s in skipped] == ["time limit"] * 2


def test_the_tiny_model_decodes_what_it_prefilled():
    import torch

    model = gpu_steps.RandomLlama(gpu_steps.TINY, torch.device("cpu"), torch.float32)
    ids = torch.tensor([[5, 9, 2, 7]])
    cache = model.kv_cache(1, 5)
    first = model.forward(ids, 0, cache)
    # the same prompt one token at a time fills the same cache and gives the same token
    again = model.kv_cache(1, 5)
    for i in range(4):
        step = model.forward(ids[:, i:i + 1], i, again)
    assert torch.equal(first, step)
    assert torch.allclose(cache[0][0][:, :, :4], again[0][0][:, :, :4], atol=1e-5)


def test_the_measurement_converts_to_the_committed_step_log(tmp_path: Path):
    original = [json.dumps({"kind": "setup", "device": "NVIDIA H200"}),
                json.dumps({"kind": "decode", "batch": 8, "context": 1024,
                            "graph_ms": 8.59, "eager_ms": 25.6}),
                json.dumps({"kind": "prefill", "batch": 4, "tokens": 2048, "ms": 225.4})]
    with (tmp_path / "log.jsonl").open("w") as out:
        assert gpu_steps.convert_measurement(original, out) == 2
    decode, prefill = read_step_log(tmp_path / "log.jsonl")
    assert decode.shape == BatchShape.decode(8, 1024) and decode.graph is True
    assert decode.duration == pytest.approx(8.59e-3)
    assert prefill.shape == BatchShape.prefill(2048, 4) and prefill.graph is False
