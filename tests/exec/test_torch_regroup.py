"""A formed pipeline group grows and shrinks mid-generation (KunServe §4.1), its layers
re-split and its KV carried over: greedy outputs stay token-identical."""

from __future__ import annotations

import pytest

from andante.cluster.kunserve.lookahead import ChunkCostModel, lookahead_planner
from andante.core import ManualClock, Request, SamplingParams
from andante.exec.torch_pipeline import PipelineExecutor, PipelineStage
from andante.exec.torch_regroup import regroup
from andante.llm import build_engine
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.policies import SchedulerConfig
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7], list(range(100, 141)),
           list(range(3, 90)), [9, 8]]
ARRIVALS = [0, 0, 1, 3, 9, 12]
NUM_TOKENS = 20
MODEL = ChunkCostModel(alpha=1e-6, beta=1e-4, gamma=1e-4)


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4r"), num_hidden_layers=4)
    return load_model(path, "float32")


def _pipeline(model: LoadedModel, slices: list[tuple[int, int]], num_blocks: int
              ) -> PipelineExecutor:
    unsplit = tiny_executor(model)
    stages = [PipelineStage(model, unsplit.options, s, num_blocks, 16, unsplit.max_model_len)
              for s in slices]
    return PipelineExecutor(model, unsplit.options, stages, unsplit.cost_model,
                            unsplit.max_model_len, pipelined=True,
                            planner=lookahead_planner(MODEL))


def _generate_with_regroups(model: LoadedModel, changes: dict[int, tuple[list[tuple[int, int]],
                                                                          int]]
                            ) -> tuple[list[Request], PipelineExecutor, int]:
    """Greedy generation on a two-stage group; at step s (a key of `changes`) the group
    is re-split over the given slices with the given block count. Returns the requests,
    the executor and how many blocks a shrink relocated."""
    pipeline = _pipeline(model, [(0, 2), (2, 4)], 16)
    clock = ManualClock()
    engine = build_engine(pipeline, clock, "sarathi",
                          SchedulerConfig(max_model_len=512, max_num_batched_tokens=512))
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [Request(f"r{i}", p, params, 0.0) for i, p in enumerate(PROMPTS)]
    relocated = 0
    step = 0
    while step <= max(ARRIVALS) or engine.has_work:
        for req, at in zip(requests, ARRIVALS, strict=True):
            if at == step:
                engine.add_request(req)
        if step in changes:
            slices, num_blocks = changes[step]
            moved = engine.scheduler.kv.resize_device(num_blocks)
            assert moved is not None
            relocated += len(moved)
            regroup(pipeline, slices, num_blocks, moved)
        engine.step()
        clock.advance_to(clock.now() + 0.01)
        step += 1
    return requests, pipeline, relocated


def test_a_group_that_grows_then_shrinks_mid_generation_is_token_identical(
        tiny4: LoadedModel) -> None:
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS, policy="sarathi",
                              arrivals=ARRIVALS)
    grow = ([(0, 1), (1, 3), (3, 4)], 64)  # a third member: more stages, more blocks
    shrink = ([(0, 3), (3, 4)], 16)  # back to two members and their blocks
    split, pipeline, relocated = _generate_with_regroups(tiny4, {4: grow, 25: shrink})
    assert [list(r.output_token_ids) for r in split] == \
        [list(r.output_token_ids) for r in reference]
    assert [s.layers_range for s in pipeline.stages] == [(0, 3), (3, 4)]
    assert all(s.kv.num_device_blocks == 16 for s in pipeline.stages)
    assert relocated > 0  # the shrink compacted blocks in use (their KV moved with them)
    times = pipeline.pipeline_times
    assert times.num_steps > 0 and times.bubble_share is not None


def test_regroup_refuses_slices_that_do_not_cover_the_model(tiny4: LoadedModel) -> None:
    pipeline = _pipeline(tiny4, [(0, 2), (2, 4)], 24)
    with pytest.raises(ValueError, match="cover"):
        regroup(pipeline, [(0, 1), (2, 4)], 24)
