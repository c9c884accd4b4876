"""Pipeline stages in processes of their own (andante.exec.torch_pipeline_procs): the
overlapped loop over them is token-identical to the unsplit model (float32), the stages'
KV is the parent's (shared memory), and a stage's error surfaces in the parent."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from andante.core import ManualClock, Request, SamplingParams
from andante.engine.overlap import OverlappedLoop
from andante.exec.torch_microbatch import PipelineTimes
from andante.exec.torch_pipeline import PipelineExecutor, PipelineStage
from andante.exec.torch_pipeline_procs import ProcessStageStream, pack, stage_model, unpack
from andante.exec.torch_regroup import regroup
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


def _weight_tensors(model: LoadedModel) -> list[torch.Tensor]:
    w = model.weights
    layers = [t for lw in w.layers for t in (lw.input_norm, lw.qkv, lw.o_proj,
                                             lw.post_norm, lw.gate_up, lw.down)]
    return [w.embed, w.final_norm, w.lm_head, *layers]


@pytest.mark.parametrize("layers", [(0, 2), (1, 3), (2, 4), (0, 4)])
def test_a_stage_model_shares_clones_of_its_weights_only(tiny4: LoadedModel,
                                                         layers: tuple[int, int]) -> None:
    before = [t.clone() for t in _weight_tensors(tiny4)]
    copy = stage_model(tiny4, layers)
    assert not any(t.is_shared() for t in _weight_tensors(tiny4))  # the serving model
    assert all(torch.equal(a, b) for a, b in zip(before, _weight_tensors(tiny4), strict=True))
    start, end = layers
    for i, (mine, theirs) in enumerate(zip(copy.weights.layers, tiny4.weights.layers,
                                           strict=True)):
        if start <= i < end:
            assert mine.qkv.is_shared() and torch.equal(mine.qkv, theirs.qkv)
            assert mine.qkv.data_ptr() != theirs.qkv.data_ptr()
        else:
            assert mine.qkv.numel() == 0
    assert (copy.weights.embed.numel() > 0) == (start == 0)
    assert (copy.weights.lm_head.numel() > 0) == (end == 4)
    unsplit, sliced = tiny_executor(tiny4), tiny_executor(tiny4)
    stage = PipelineStage(tiny4, unsplit.options, layers, 8, 0, unsplit.max_model_len)
    built = PipelineStage(copy, sliced.options, layers, 8, 0, sliced.max_model_len)
    assert built.weight_bytes == stage.weight_bytes


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
    assert not any(t.is_shared() for t in _weight_tensors(pipeline.model))  # untouched
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


@pytest.mark.slow
def test_a_killed_stage_process_surfaces_at_once(tiny4: LoadedModel) -> None:
    pipeline = _pipeline(tiny4, [(0, 2), (2, 4)])
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    engine.add_request(Request("r0", [5, 6, 7], SamplingParams(max_tokens=2), 0.0))
    try:
        pipeline.start_workers()
        stream = pipeline._stream
        assert isinstance(stream, ProcessStageStream)
        stream._procs[1].kill()
        began = time.monotonic()
        assert pipeline.submit(engine.schedule_step(), 2) == 1
        with pytest.raises(RuntimeError, match="died"):
            for _ in range(3):  # stage 0's event may come first
                pipeline.next_event()
        assert time.monotonic() - began < 30.0  # not the one-minute poll
    finally:
        pipeline.close()


@pytest.mark.slow
def test_regrouped_process_stages_start_again_and_stay_token_identical(
        tiny4: LoadedModel) -> None:
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS, policy="vllm")
    expected = [list(r.output_token_ids) for r in reference]
    pipeline = _pipeline(tiny4, [(0, 2), (2, 4)])
    engine = build_engine(pipeline, ManualClock(), "vllm", CONFIG)
    loop = OverlappedLoop(engine, pipeline)
    try:
        assert [list(r.output_token_ids) for r in _serve(engine, loop, "a")] == expected
        regroup(pipeline, [(0, 1), (1, 3), (3, 4)], 64)
        stream = pipeline._stream  # started again over the three new stages
        assert isinstance(stream, ProcessStageStream) and len(stream._procs) == 3
        assert all(p.is_alive() for p in stream._procs)
        assert [list(r.output_token_ids) for r in _serve(engine, loop, "b")] == expected
    finally:
        pipeline.close()


def test_each_stage_process_takes_its_share_of_the_threads(tiny4: LoadedModel) -> None:
    """Two stage processes of an executor of 4 threads run 2 intra-op threads each (both
    at 4 would put 8 threads on 4 cores; andante.exec.torch_microbatch's
    `stage_threads`), the executor's resolved count whatever the caller's count is now,
    and `threads_per_stage` when it is set (0: the executor's whole count), as thread
    stages do."""
    before = torch.get_num_threads()
    try:
        unsplit = tiny_executor(tiny4, num_threads=1)  # (no thread probe)
        options = dataclasses.replace(unsplit.options, num_threads=None)
        stages = [PipelineStage(tiny4, options, s, 64, 64, unsplit.max_model_len)
                  for s in [(0, 2), (2, 4)]]
        torch.set_num_threads(4)  # the executor resolves 4
        pipeline = PipelineExecutor(tiny4, options, stages, unsplit.cost_model,
                                    unsplit.max_model_len, pipelined=True,
                                    stage_workers="process")
        torch.set_num_threads(1)
        for per_stage, expected in [(None, 2), (0, 4), (3, 3)]:
            pipeline.threads_per_stage = per_stage
            stream = pipeline._new_stream()  # (its processes start at `start`)
            assert isinstance(stream, ProcessStageStream)
            assert stream.options.num_threads == expected
        assert options.num_threads is None
        with pytest.raises(ValueError, match="threads"):
            ProcessStageStream(tiny4, options, stages, PipelineTimes(), 0)
    finally:
        torch.set_num_threads(before)
