"""benchmarks/prefill_step.py: its shapes, its step of fresh prompts, and one JSON line
from a run on the tiny checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_benchmark
from tests.models.helpers import make_tiny_checkpoint


def test_shapes_are_parsed_and_bad_ones_refused() -> None:
    script = load_benchmark("prefill_step")
    assert script.parse_shape("1x256") == (1, 256) and script.parse_shape("8X128") == (8, 128)
    for bad in ("256", "0x10", "2x1", "axb"):
        with pytest.raises(argparse.ArgumentTypeError, match="NxC|N >= 1"):
            script.parse_shape(bad)


def test_the_step_holds_fresh_prompts_in_their_own_blocks() -> None:
    batch = load_benchmark("prefill_step").prefill_batch(3, 40, 16)
    assert batch.num_new_tokens == [40] * 3 and batch.num_cached_tokens == [0] * 3
    assert batch.samples == [True] * 3
    blocks = [b for table in batch.block_tables for b in table]
    assert len(blocks) == len(set(blocks)) == 3 * 3


def test_a_run_prints_one_json_line(tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    script = load_benchmark("prefill_step")
    checkpoint = make_tiny_checkpoint(tmp_path)
    assert script.main(["--model", str(checkpoint), "--shapes", "2x20", "--threads", "1",
                        "--rounds", "1", "--steps", "1", "--layer-form", "plain"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(record["ms_per_step"]) == {"sdpa_2x20_t1", "matmul_2x20_t1"}
    assert record["prefill_matmul"] == {"sdpa": False, "matmul": True}
    assert all(v["cpu"] > 0 for v in record["ms_per_step"].values())
