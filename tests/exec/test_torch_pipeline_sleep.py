"""Sleep mode of the pipeline executor (andante.exec.torch_pipeline_sleep): every
stage's KV tensors (and at level 2 its weights) are really released, a woken pipeline
answers token for token as before, and an asleep one refuses to step."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from andante.core import Request
from andante.exec.base import Sleepable
from andante.exec.torch_pipeline import PipelineExecutor, PipelineStage
from andante.models import load_model
from andante.models.loader import LoadedModel
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7]]
NUM_TOKENS = 12
SLICES = [(0, 1), (1, 3), (3, 4)]


@pytest.fixture(scope="module")
def tiny4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4"), num_hidden_layers=4)


def _pipeline(model: LoadedModel, pipelined: bool = False) -> PipelineExecutor:
    unsplit = tiny_executor(model)
    stages = [PipelineStage(model, unsplit.options, s, 64, 64, unsplit.max_model_len)
              for s in SLICES]
    return PipelineExecutor(model, unsplit.options, stages, unsplit.cost_model,
                            unsplit.max_model_len, pipelined)


def _greedy(executor: PipelineExecutor) -> list[list[int]]:
    requests: list[Request]
    requests, _ = run_engine(executor, PROMPTS, NUM_TOKENS, policy="sarathi")
    return [list(r.output_token_ids) for r in requests]


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("level", [1, 2])
def test_greedy_outputs_identical_after_a_sleep_wake_cycle(
        tiny4_path: Path, level: int, pipelined: bool) -> None:
    pipeline = _pipeline(load_model(tiny4_path, "float32"), pipelined)
    assert isinstance(pipeline, Sleepable)
    before = _greedy(pipeline)
    pipeline.sleep(level)
    assert pipeline.sleeping == level
    with pytest.raises(RuntimeError, match="asleep"):
        _greedy(pipeline)
    pipeline.wake_up()
    assert pipeline.sleeping is None
    assert _greedy(pipeline) == before
    pipeline.close()


def test_level_1_frees_every_stage_kv_and_keeps_the_weights(tiny4_path: Path) -> None:
    pipeline = _pipeline(load_model(tiny4_path, "float32"))
    pools = [weakref.ref(s.kv.device) for s in pipeline.stages]
    hosts = [weakref.ref(s.kv.host) for s in pipeline.stages]
    weight = pipeline.stages[1].layers[0].w.qkv  # type: ignore[union-attr]
    blocks = pipeline.num_kv_blocks(pipeline.options.block_size)
    pipeline.sleep(1)
    gc.collect()
    assert all(ref() is None for ref in pools + hosts)  # no layer keeps a view of them
    assert all(layer.pool.numel() == 0 for s in pipeline.stages for layer in s.layers)
    assert pipeline.stages[1].layers[0].w.qkv is weight  # type: ignore[union-attr]
    pipeline.wake_up()
    assert pipeline.num_kv_blocks(pipeline.options.block_size) == blocks
    assert all(s.kv.device.numel() > 0 for s in pipeline.stages)


def test_level_2_drops_the_stages_weights(tiny4_path: Path) -> None:
    pipeline = _pipeline(load_model(tiny4_path, "float32"))
    layer = weakref.ref(pipeline.stages[1].layers[0])
    pipeline.sleep(2)
    gc.collect()
    assert layer() is None and all(not s.layers for s in pipeline.stages)
    assert pipeline.stages[0].embed is None and pipeline.stages[-1].lm_head is None
    assert not pipeline.model.weights.layers
    pipeline.wake_up()
    assert [len(s.layers) for s in pipeline.stages] == [1, 2, 1]
    assert pipeline.stages[0].embed is not None and pipeline.stages[-1].lm_head is not None


def test_bad_level_is_refused(tiny4_path: Path) -> None:
    pipeline = _pipeline(load_model(tiny4_path, "float32"))
    with pytest.raises(ValueError, match="level"):
        pipeline.sleep(3)
