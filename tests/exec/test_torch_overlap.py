"""Overlapped steps on the real engine (KunServe §4.3, §5): each microbatch completes on
its own and the next step enters stage 0 while earlier microbatches are in later stages;
outputs stay token-identical to the unsplit model."""

from __future__ import annotations

import pytest

from andante.cluster.kunserve.lookahead import ChunkCostModel, lookahead_planner, slot_config
from andante.core import ManualClock, Request, SamplingParams
from andante.engine.overlap import OverlappedLoop
from andante.exec.microbatch import PipelineEvent
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
ARRIVALS = [0, 0, 2, 5, 5, 9]  # loop iterations
MODEL = ChunkCostModel(alpha=1e-6, beta=1e-4, gamma=1e-4)
# a small token budget: prompts go in chunks, some of them inner (sampling nothing)
BASE = SchedulerConfig(max_model_len=512, max_num_batched_tokens=24, max_num_seqs=8)


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4o"), num_hidden_layers=4)
    return load_model(path, "float32")


def _pipeline(model: LoadedModel, slices: list[tuple[int, int]], lookahead: bool
              ) -> PipelineExecutor:
    unsplit = tiny_executor(model)
    stages = [PipelineStage(model, unsplit.options, s, 64, 64, unsplit.max_model_len)
              for s in slices]
    return PipelineExecutor(model, unsplit.options, stages, unsplit.cost_model,
                            unsplit.max_model_len, pipelined=True,
                            planner=lookahead_planner(MODEL) if lookahead else None)


@pytest.mark.parametrize("slices", [[(0, 2), (2, 4)], [(0, 1), (1, 3), (3, 4)]])
@pytest.mark.parametrize(("lookahead", "first_on_caller"),
                         [(False, False), (True, False), (True, True)])
def test_overlapped_steps_are_token_identical_and_overlap(tiny4: LoadedModel, slices,
                                                          lookahead, first_on_caller) -> None:  # type: ignore[no-untyped-def]
    reference, _ = run_engine(tiny_executor(tiny4), PROMPTS, NUM_TOKENS, policy="vllm")
    pipeline = _pipeline(tiny4, slices, lookahead)
    pipeline.first_stage_on_caller = first_on_caller  # stage 0 computed in `submit`
    stages = len(slices)
    engine = build_engine(pipeline, ManualClock(), "vllm", slot_config(BASE, stages, 0))
    loop = OverlappedLoop(engine, pipeline, lambda j: slot_config(BASE, stages, j))
    events: list[PipelineEvent] = []
    next_event = pipeline.next_event

    def spy() -> PipelineEvent:
        events.append(next_event())
        return events[-1]
    pipeline.next_event = spy  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [Request(f"r{i}", p, params, 0.0) for i, p in enumerate(PROMPTS)]
    iteration = 0
    while iteration <= max(ARRIVALS) or loop.has_work:
        for req, at in zip(requests, ARRIVALS, strict=True):
            if at == iteration:
                engine.add_request(req)
        loop.step()
        iteration += 1
    pipeline.close()
    assert [list(r.output_token_ids) for r in requests] == \
        [list(r.output_token_ids) for r in reference]
    assert loop.num_overlapped > 0  # steps entered with microbatches still in flight
    # inner prompt chunks were released when their microbatch left stage 0
    assert any(not e.last_stage and not e.batch.is_empty for e in events)
    assert not engine.scheduler.has_in_flight
    times = pipeline.pipeline_times
    assert times.num_steps == loop.num_steps
    share = times.bubble_share
    assert share is not None and 0.0 <= share < 1.0


def test_a_stage_error_surfaces_from_next_event(tiny4: LoadedModel) -> None:
    pipeline = _pipeline(tiny4, [(0, 2), (2, 4)], lookahead=False)
    engine = build_engine(pipeline, ManualClock(), "vllm", BASE)
    engine.add_request(Request("r0", [5, 6, 7], SamplingParams(max_tokens=2), 0.0))
    batch = engine.schedule_step()

    def boom(*_: object) -> object:
        raise RuntimeError("stage failed")
    pipeline.stages[1].forward = boom  # type: ignore[method-assign]
    assert pipeline.submit(batch, 2) == 1
    assert not pipeline.next_event().last_stage  # stage 0 ran
    with pytest.raises(RuntimeError, match="stage failed"):
        pipeline.next_event()
    # broken for good: later calls raise at once, none waits for the dropped microbatch
    with pytest.raises(RuntimeError, match="stage failed"):
        pipeline.next_event()
    with pytest.raises(RuntimeError, match="stage failed"):
        pipeline.submit(batch, 2)
    pipeline.close()
