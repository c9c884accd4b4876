"""Pipeline parallelism (FastServe §4.3): batches in flight, pending jobs scheduled."""

from __future__ import annotations

import pytest

from andante.core import PreemptionMode
from andante.exec.batch import StepResult
from andante.perf.catalog import get_model
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, build_simulator, simulate
from andante.sim.pipeline import PipelineSimInstance, stage_model
from andante.workload import WorkloadConfig, build_workload, to_requests
from tests.engine.helpers import make_engine, make_request


def _result(batch) -> StepResult:  # type: ignore[no-untyped-def]
    return StepResult([0 if s else None for s in batch.samples], duration=0.01)


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "priority", "fastserve", "fastserve-fcfs"])
def test_requests_in_flight_are_neither_scheduled_nor_preempted(policy: str) -> None:
    engine, _, _ = make_engine(policy, 64, num_host_blocks=16,
                               preemption_mode=PreemptionMode.SWAP)
    a, b = make_request("a", 8, 4), make_request("b", 8, 4, arrival=0.001)
    engine.add_request(a)
    scheduler = engine.scheduler
    first = scheduler.schedule()  # a's batch enters the pipeline
    assert first.requests == [a]
    engine.add_request(b)
    second = scheduler.schedule()  # at the next stage boundary: only pending jobs
    assert second.requests == [b] and not second.swap_out
    assert scheduler.schedule().is_empty  # both in flight: nothing to do
    scheduler.update(first, _result(first))
    third = scheduler.schedule()
    assert third.requests == [a] and a.num_computed_tokens == 8  # back after its batch
    scheduler.update(second, _result(second))
    scheduler.update(third, _result(third))
    assert a.num_output_tokens == 2 and b.num_output_tokens == 1


def test_stage_model_splits_the_layers() -> None:
    model = get_model("llama-3.1-70b")
    assert stage_model(model, 1) is model
    assert stage_model(model, 2).num_layers == 40 and stage_model(model, 3).num_layers == 27
    with pytest.raises(ValueError, match="pp"):
        stage_model(model, 0)


def _watch_pipeline(inst: PipelineSimInstance) -> list[int]:
    """Record, at each batch start, how many batches are already in flight; check that
    no request is in two batches in flight at once."""
    depths: list[int] = []
    flying: list[set[str]] = []
    begin, finish = inst.begin_step, inst.finish_step

    def begin_step(now: float) -> float | None:
        depth = inst.num_in_flight
        done = begin(now)
        if done is not None:
            ids = {r.request_id for r in max(inst._pipeline, key=lambda c: c.seq).batch.requests}
            assert all(not ids & other for other in flying)
            flying.append(ids)
            depths.append(depth)
        return done

    def finish_step():  # type: ignore[no-untyped-def]
        flying.pop(0)
        return finish()

    inst.begin_step = begin_step  # type: ignore[method-assign]
    inst.finish_step = finish_step  # type: ignore[method-assign]
    return depths


@pytest.mark.parametrize("policy", ["vllm", "fastserve"])
def test_pipeline_keeps_several_batches_in_flight(policy: str) -> None:
    spec = ClusterSpec(model="llama-3.1-70b", hardware="a100-80g", tp=4, pp=2, policy=policy,
                       overlap_swaps=True)
    sim = build_simulator(spec)
    inst = sim.instances[0]
    assert isinstance(inst, PipelineSimInstance) and inst.num_stages == 2
    depths = _watch_pipeline(inst)
    workload = build_workload(WorkloadConfig(rate=8.0, num_requests=80,
                                             lengths="uniform:16:400:4:80", seed=2))
    report = sim.run(to_requests(workload))
    assert not report.unfinished and len(report.finished) == 80
    assert max(depths) == 1  # a second batch entered while the first was in flight
    for req in report.finished:
        times = req.timeline.token_times
        assert len(times) == req.sampling.max_tokens and times == sorted(times)


def test_two_stages_serve_more_than_one_when_batches_are_bounded() -> None:
    workload = build_workload(WorkloadConfig(rate=8.0, num_requests=150,
                                             lengths="uniform:64:512:32:200", seed=4))
    config = SchedulerConfig(max_num_seqs=16)  # pending jobs fill every stage's batch
    runs = {pp: simulate(ClusterSpec(model="llama-3.1-70b", hardware="a100-80g", tp=4, pp=pp,
                                     policy="fastserve", scheduler=config), workload)
            for pp in (1, 2)}
    assert runs[2].summary.e2el.mean < 0.8 * runs[1].summary.e2el.mean
    assert runs[2].summary.output_throughput > runs[1].summary.output_throughput
    with pytest.raises(ValueError, match="pp"):
        ClusterSpec(pp=0)
