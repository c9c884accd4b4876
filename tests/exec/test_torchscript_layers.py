"""The engine's layers run as TorchScript, with the same tokens as the eager code."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from andante.exec import torch_attention, torch_layers
from andante.models import load_model, rope, torchscript
from andante.policies import SchedulerConfig
from tests.exec.engine_helpers import run_engine, tiny_executor

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [list(range(10, 60)), [5, 17, 33, 200, 12], list(range(100, 141)), [7] * 20]
ARRIVALS = [0, 0, 2, 3]


def _tokens(checkpoint: Path) -> list[list[int]]:
    """bfloat16 greedy tokens with decodes, fresh prompts and chunks after a cached
    prefix in the same steps (a 32-token budget chunks the longer prompts)."""
    model = load_model(checkpoint, "bfloat16")
    config = SchedulerConfig(max_model_len=512, max_num_batched_tokens=32)
    requests, _ = run_engine(tiny_executor(model, dtype="bfloat16"), PROMPTS, 12,
                             config=config, arrivals=ARRIVALS)
    return [list(r.output_token_ids) for r in requests]


def test_hot_functions_are_scripted() -> None:
    if os.environ.get(torchscript.DISABLE_ENV, "") not in ("", "0"):
        pytest.skip("TorchScript disabled in this environment")
    for fn in (torch_layers.fused_stack, torch_layers.fused_layer, torch_layers.attend,
               torch_attention.attention, torch_attention.write_kv, rope.apply_rope,
               rope.apply_rope_):
        assert isinstance(fn, torch.jit.ScriptFunction), fn


@pytest.mark.slow
def test_scripted_tokens_equal_eager_tokens(tiny_llama: Path) -> None:
    scripted = _tokens(tiny_llama)
    code = ("import json, sys; from pathlib import Path; "
            "from tests.exec.test_torchscript_layers import _tokens; "
            "print(json.dumps(_tokens(Path(sys.argv[1]))))")
    env = {**os.environ, torchscript.DISABLE_ENV: "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_llama)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True, timeout=300)
    eager = json.loads(proc.stdout.strip().splitlines()[-1])
    assert scripted == eager
    assert all(len(t) == 12 for t in scripted)
