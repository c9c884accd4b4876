"""benchmarks/omp_regions.py: policies and shapes parsed, and one JSON line from a run on
the tiny checkpoint whose region counts add up by operator."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_benchmark
from tests.models.helpers import make_tiny_checkpoint


def test_policies_and_shapes_are_parsed_and_bad_ones_refused() -> None:
    script = load_benchmark("omp_regions")
    assert script.policy_env("passive") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert script.policy_env("spin:1000") == {"GOMP_SPINCOUNT": "1000"}
    assert script.parse_shape("8x128") == (8, 128)
    for bad in ("spin:", "spin:x", "active"):
        with pytest.raises(argparse.ArgumentTypeError, match="passive, default or spin"):
            script.policy_env(bad)
    for bad in ("256", "0x10", "ax2"):
        with pytest.raises(argparse.ArgumentTypeError, match="NxC"):
            script.parse_shape(bad)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="the region-counting shim needs a C compiler")
def test_a_run_counts_regions_by_operator(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    script = load_benchmark("omp_regions")
    checkpoint = make_tiny_checkpoint(tmp_path)
    assert script.main(["--model", str(checkpoint), "--layer-form", "plain",
                        "--prefill", "2x20", "--decode", "2", "--policies", "passive",
                        "--bursts", "5", "--elements", "100000"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    steps = record["regions"]["steps"]
    assert set(steps) == {"prefill_2x20", "decode_b2"}
    for step in steps.values():  # the tiny model's GEMMs open regions at two threads
        assert step["total"] == sum(step["by_op"].values())
        assert step["by_op"].get("mkldnn._linear_pointwise.default", 0) > 0
    cost = record["region_us"]["passive"]
    assert cost["t1"]["min"] > 0 and cost["t2"]["min"] > 0
