"""Pipeline stages in processes of their own (andante.exec.torch_pipeline_procs): the
overlapped loop over them is token-identical to the unsplit model (float32), the stages'
KV is the parent's (shared memory), and a stage's error surfaces in the parent."""

from __future__ import annotations

import pytest
import torch

from andante.core import ManualClock, Request, SamplingParams
from andante.engine.overlap import OverlappedLoop
from andante.exec.torch_pipeline import PipelineExecutor, PipelineStage
from andante.exec.torch_pipeline_procs import pack, unpack
from andante.llm import build_engine
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.policies import SchedulerConfig
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7], list(range(100, 141))]
NUM_TOKENS = 10
CONFIG = SchedulerConfig(max_model_len=512, max_num_batched_tokens=24, max_num_seqs=8)


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4p"), num_hidden_layers=4)
    return load_model(path, "float32")


def _pipeline(model: LoadedModel, slices: list[tuple[int, int]]) -> PipelineExecutor:
    unsplit = tiny_executor(model)
    stages = [PipelineStage(model, unsplit.options, s, 64, 64, unsplit.max_model_len)
              for s in slices]
    return PipelineExecutor(model, unsplit.options, stages, unsplit.cost_model,
                            unsplit.max_model_len, pipelined=True, stage_workers="process")


def test_pack_keeps_tensors_exactly() -> None:
    values = {"bf16": torch.randn(3, 5).to(torch.bfloat16), "ids": torch.arange(7),
              "empty": torch.empty(0, 4), "mask": torch.full((2, 1, 1, 3), float("-inf"))}
    back = unpack(pack(values))
    for key, tensor in values.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor)


@pytest.mark.slow
def test_process_stages_are_token_identical_and_share_the_kv(tiny4: LoadedModel) -> None:
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS, policy="vllm")
    pipeline = _pipeline(tiny4, [(0, 1), (1, 3), (3, 4)])
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    loop = OverlappedLoop(engine, pipeline)
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [Request(f"r{i}", p, params, 0.0) for i, p in enumerate(PROMPTS)]
    for req in requests:
        engine.add_request(req)
    loop.run()  # closes the pipeline at the end
    assert [list(r.output_token_ids) for r in requests] == \
        [list(r.output_token_ids) for r in reference]
    assert loop.num_overlapped > 0
    # the processes wrote the parent's pools (shared memory): the KV is there
    assert all(s.kv.device.is_shared() and s.kv.device.abs().sum() > 0
               for s in pipeline.stages)
    assert pipeline.activation_bytes > 0 and pipeline.num_activation_transfers > 0
    share = pipeline.pipeline_times.bubble_share
    assert share is not None and 0.0 <= share < 1.0


@pytest.mark.slow
def test_a_process_stage_error_surfaces(tiny4: LoadedModel) -> None:
    pipeline = _pipeline(tiny4, [(0, 2), (2, 4)])
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    engine.add_request(Request("r0", [5, 6, 7], SamplingParams(max_tokens=2), 0.0))
    batch = engine.schedule_step()
    batch.requests[0].prompt_token_ids[0] = 10**9  # out of the vocabulary: stage 0 fails
    try:
        assert pipeline.submit(batch, 2) == 1
        with pytest.raises(RuntimeError, match="stage 0 failed"):
            pipeline.next_event()
    finally:
        pipeline.close()


def _serve(engine, loop: OverlappedLoop, tag: str) -> list[Request]:  # type: ignore[no-untyped-def]
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [Request(f"{tag}{i}", p, params, 0.0) for i, p in enumerate(PROMPTS)]
    for req in requests:
        engine.add_request(req)
    while loop.has_work:
        loop.step()
    return requests


@pytest.mark.slow
@pytest.mark.parametrize("level", [1, 2])
def test_process_stages_after_a_sleep_run_on_the_woken_pools_and_weights(
        tiny4: LoadedModel, level: int) -> None:
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS, policy="vllm")
    expected = [list(r.output_token_ids) for r in reference]
    pipeline = _pipeline(tiny4, [(0, 2), (2, 4)])
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    loop = OverlappedLoop(engine, pipeline)
    try:
        assert [list(r.output_token_ids) for r in _serve(engine, loop, "a")] == expected
        pipeline.sleep(level)
        pipeline.wake_up()
        engine.scheduler.kv.reset_prefix_cache()  # as andante.server.sleep does
        assert [list(r.output_token_ids) for r in _serve(engine, loop, "b")] == expected
        # the new stage processes wrote the parent's new pools (shared memory)
        assert all(s.kv.device.is_shared() and s.kv.device.abs().sum() > 0
                   for s in pipeline.stages)
    finally:
        pipeline.close()
