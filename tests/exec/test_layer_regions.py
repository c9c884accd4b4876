"""The OpenMP parallel regions a 256-token prefill's attention part of a layer opens at
two threads (issue 32: under OMP_WAIT_POLICY=PASSIVE each region wakes the sleeping
worker, 24-93 us apiece): RoPE, the K/V write and the causal attention of
andante.exec.torch_layers.attend, counted by benchmarks/omp_regions.py's shim."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from andante.exec.torch_attention import PREFILL_BLOCK, attention_plan
from andante.exec.torch_inputs import PrefillGroup, StepInputs
from tests.benchmarks.scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]

COUNT = r"""
import ctypes, torch
from andante.exec.torch_attention import (PREFILL_BLOCK, AttentionPlan, causal_block)
from andante.exec.torch_layers import attend
torch.set_num_threads(2)
regions = ctypes.CDLL(None).andante_omp_regions
regions.restype = ctypes.c_long
t, heads, kvh, dim, bf = 256, 9, 3, 64, torch.bfloat16  # SmolLM2's attention shapes
pool = torch.zeros(2 * kvh, 64, 16, dim, dtype=bf)
slots = pool.view(2 * kvh, -1, dim)
empty = torch.empty(0)
plan = AttentionPlan(torch.arange(t), 0, empty, empty, [0], [1], [t], [0], [None], [None],
                     False, False, True, 0, causal_block(PREFILL_BLOCK, bf))
cos, sin = torch.randn(t, 1, dim, dtype=bf), torch.randn(t, 1, dim, dtype=bf)
def run():
    qkv = torch.randn(t, (heads + 2 * kvh) * dim, dtype=bf)
    before = regions()
    attend(qkv, cos, sin, pool, slots, plan, heads, kvh, dim, None)
    return regions() - before
run()
print(run())
"""


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="the region-counting shim needs a C compiler")
def test_a_prefill_layers_attention_opens_few_regions(tmp_path: Path) -> None:
    shim = load_benchmark("omp_regions").build_shim(tmp_path)
    env = {**os.environ, "LD_PRELOAD": str(shim), "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", COUNT], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    # RoPE 3 (flip, mul_, addcmul_), one K/V write, one 256-row attention block 8: 12
    # (20 with a roll, K and V written apart and two 128-row blocks)
    assert int(proc.stdout.split()[-1]) <= 12


def test_a_decode_steps_plan_builds_no_causal_mask() -> None:
    """The prefill path's 256 x 256 causal mask is built once (two regions), not in every
    step's plan: a decode-only step's plan has none, a prefill's shares one tensor."""
    pool = torch.zeros(6, 8, 16, 64, dtype=torch.bfloat16)
    one = torch.ones(1, dtype=torch.long)

    def inputs(groups: list[PrefillGroup]) -> StepInputs:
        return StepInputs(one, one, one, 1, one, torch.zeros(1, 1, 1, 16), groups, one, [0],
                          prefill_matmul=True)

    assert attention_plan(inputs([]), pool).causal_block.numel() == 0
    first = attention_plan(inputs([PrefillGroup(1, 1, 1)]), pool).causal_block
    again = attention_plan(inputs([PrefillGroup(1, 1, 1)]), pool).causal_block
    assert first.shape == (PREFILL_BLOCK, PREFILL_BLOCK) and first is again
