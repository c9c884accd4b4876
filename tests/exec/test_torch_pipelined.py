"""Pipelined execution (KunServe §4.3, §5): stages on their own threads, microbatches in
flight, lookahead's microbatches; token-identical to the unsplit model."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from andante.cluster.kunserve.lookahead import (
    ChunkCostModel,
    lookahead_planner,
    step_microbatches,
)
from andante.core import ManualClock, Request, SamplingParams
from andante.engine.overlap import OverlappedLoop
from andante.exec.batch import StepBatch
from andante.exec.microbatch import Piece, by_rows, check_plan, sub_batch
from andante.exec.torch_microbatch import StageWorkers, start_thread
from andante.exec.torch_pipeline import PipelineExecutor, PipelineStage
from andante.llm import build_engine
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.policies import SchedulerConfig
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7], list(range(100, 141)),
           list(range(3, 90)), [9, 8]]
NUM_TOKENS = 12
ARRIVALS = [0, 0, 1, 3, 3, 6]
# eq. (1) with a real quadratic term: prefill chunks get cut between microbatches
MODEL = ChunkCostModel(alpha=1e-6, beta=1e-4, gamma=1e-4)


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4p"), num_hidden_layers=4)
    return load_model(path, "float32")


def _pipeline(model: LoadedModel, slices: list[tuple[int, int]], **kwargs: object
              ) -> PipelineExecutor:
    unsplit = tiny_executor(model)
    stages = [PipelineStage(model, unsplit.options, s, 64, 64, unsplit.max_model_len)
              for s in slices]
    return PipelineExecutor(model, unsplit.options, stages, unsplit.cost_model,
                            unsplit.max_model_len, **kwargs)  # type: ignore[arg-type]


def _outputs(requests: list[Request]) -> list[list[int]]:
    return [list(r.output_token_ids) for r in requests]


@pytest.mark.parametrize("slices", [[(0, 2), (2, 4)], [(0, 1), (1, 3), (3, 4)]])
@pytest.mark.parametrize("lookahead", [False, True])
def test_pipelined_microbatches_are_token_identical(tiny4: LoadedModel, slices, lookahead
                                                    ) -> None:  # type: ignore[no-untyped-def]
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS, policy="sarathi",
                              arrivals=ARRIVALS)
    planner = lookahead_planner(MODEL) if lookahead else None
    pipeline = _pipeline(tiny4, slices, pipelined=True, planner=planner)
    split, engine = run_engine(pipeline, PROMPTS, NUM_TOKENS, policy="sarathi",
                               arrivals=ARRIVALS)
    assert _outputs(split) == _outputs(reference)
    times = pipeline.pipeline_times
    assert times.num_steps == engine.num_steps
    assert times.num_microbatches > times.num_steps  # several in flight per step
    share = times.bubble_share
    assert share is not None and 0.0 <= share < 1.0


def _batch(rows: list[tuple[int, int]]) -> StepBatch:
    batch = StepBatch()
    params = SamplingParams(max_tokens=4)
    for k, (cached, new) in enumerate(rows):
        req = Request(f"q{k}", list(range(1, cached + new + 1)), params, 0.0)
        batch.add(req, new, cached, True, [k])
    return batch


def test_lookahead_cuts_a_long_prefill_and_only_its_end_samples() -> None:
    batch = _batch([(0, 400), (30, 1), (50, 1)])
    plan = step_microbatches(batch, 2, MODEL)
    check_plan(batch, plan)
    assert len(plan) == 2
    cut = [p for micro in plan for p in micro if p.row == 0]
    assert len(cut) == 2 and cut[0].prefix == 0 and cut[1].prefix == cut[0].tokens
    first, _ = sub_batch(batch, [cut[0]])
    second, _ = sub_batch(batch, [cut[1]])
    assert first.samples == [False] and second.samples == [True]


def test_plans_that_do_not_cover_the_step_are_refused() -> None:
    batch = _batch([(0, 8), (4, 1)])
    with pytest.raises(ValueError, match="continue"):
        check_plan(batch, [[Piece(0, 2, 6)], [Piece(1, 4, 1)]])
    with pytest.raises(ValueError, match="not covered"):
        check_plan(batch, [[Piece(0, 0, 8)]])
    assert [len(m) for m in by_rows(_batch([(0, 1)] * 5), 2)] == [3, 2]


def test_a_stage_error_surfaces_on_the_callers_thread() -> None:
    def boom(k: int, hidden: object, item: object) -> object:
        if k == 1:
            raise RuntimeError("stage 1 failed")
        return item

    with pytest.raises(RuntimeError, match="stage 1 failed"):
        StageWorkers(2, boom).run([1, 2, 3])


@pytest.mark.parametrize("overlapped", [False, True])
def test_each_stage_thread_takes_its_share_of_the_cores(tiny4: LoadedModel, overlapped: bool
                                                        ) -> None:
    """Two stages on an executor of 2 threads: each stage thread runs 1 intra-op thread
    (two teams of 2 would oversubscribe the 2 cores), the caller keeps its 2; outputs
    unchanged."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        reference, _ = run_engine(tiny_executor(tiny4, num_threads=2), PROMPTS, NUM_TOKENS)
        unsplit = tiny_executor(tiny4, num_threads=2)
        stages = [PipelineStage(tiny4, unsplit.options, s, 64, 64, unsplit.max_model_len)
                  for s in [(0, 2), (2, 4)]]
        seen: set[tuple[int, int]] = set()
        for k, stage in enumerate(stages):
            forward = stage.forward

            def counted(hidden, inputs, k=k, forward=forward):  # type: ignore[no-untyped-def]
                seen.add((k, torch.get_num_threads()))
                return forward(hidden, inputs)
            stage.forward = counted  # type: ignore[method-assign]
        pipeline = PipelineExecutor(tiny4, unsplit.options, stages, unsplit.cost_model,
                                    unsplit.max_model_len, pipelined=True)
        if overlapped:
            engine = build_engine(pipeline, ManualClock(), "vllm", SchedulerConfig(
                max_model_len=512, max_num_batched_tokens=512))
            params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
            split = [Request(f"r{i}", p, params, 0.0) for i, p in enumerate(PROMPTS)]
            for req in split:
                engine.add_request(req)
            OverlappedLoop(engine, pipeline).run()
        else:
            split, _ = run_engine(pipeline, PROMPTS, NUM_TOKENS)
            pipeline.close()
        assert seen == {(0, 1), (1, 1)}
        assert torch.get_num_threads() == 2
        assert _outputs(split) == _outputs(reference)
    finally:
        torch.set_num_threads(before)


def test_stage_threads_are_the_executors_count_not_the_callers(tiny4: LoadedModel) -> None:
    """The stage threads' count is the executor's, resolved once, not the caller's
    count at the step (a leader's thread runs 1 after a small step, all after a big
    one: TorchExecutor._set_threads); threads_per_stage=0 is that whole count, set
    explicitly (not "leave torch's", which a stage thread's own setting changes)."""
    before = torch.get_num_threads()
    try:
        unsplit = tiny_executor(tiny4, num_threads=1)  # (no thread probe)
        options = dataclasses.replace(unsplit.options, num_threads=None)
        stages = [PipelineStage(tiny4, options, s, 64, 64, unsplit.max_model_len)
                  for s in [(0, 2), (2, 4)]]
        torch.set_num_threads(4)  # the executor resolves 4
        pipeline = PipelineExecutor(tiny4, options, stages, unsplit.cost_model,
                                    unsplit.max_model_len, pipelined=True)
        for caller in (1, 3):
            torch.set_num_threads(caller)
            assert pipeline._new_stream().threads == 2
            pipeline.threads_per_stage = 0
            assert pipeline._new_stream().threads == 4
            pipeline.threads_per_stage = None
    finally:
        torch.set_num_threads(before)


def test_a_started_thread_sets_its_own_count() -> None:
    """A new thread starts at the count some thread set last (torch 2.13); one from
    `start_thread` at the count it is given."""
    before = torch.get_num_threads()
    seen: list[int] = []
    try:
        lowered = threading.Thread(target=torch.set_num_threads, args=(1,))
        lowered.start()
        lowered.join()
        plain = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        plain.start()
        plain.join()
        start_thread("counted", 3, lambda: seen.append(torch.get_num_threads())).join()
        assert seen == [1, 3]
    finally:
        torch.set_num_threads(before)
