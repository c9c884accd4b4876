"""KunServe on in-process engines: forming a pipeline group of two instances moves the
partner's requests to the leader with their KV, restoring gives every member an engine
of its own again, and greedy outputs stay those of the unsplit model throughout; a
member that dies makes the leader restore without losing a request."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from andante.cluster.kunserve.seam import GroupPlan
from andante.core import MonotonicClock, Request, SamplingParams
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_pipeline import PipelineExecutor
from andante.llm import build_engine
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.policies import SchedulerConfig
from andante.runtime.kunserve import LocalGroupOptions, LocalPipelineGroups
from andante.runtime.kunserve_loop import GroupLoop
from andante.runtime.kunserve_parts import Origin
from andante.runtime.kunserve_stages import build_pipeline
from andante.runtime.local import LocalInstance
from andante.runtime.worker import InstanceWorker, StepMessage
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint

NUM_LAYERS = 4
HALVES = GroupPlan((0, 1), ((0, 2), (2, 4)))
PROMPTS = [list(range(10, 40)), [5, 17, 33, 200, 12], list(range(100, 141)), [7, 7, 7, 9]]
NUM_TOKENS = 160  # long enough that every request runs across the form


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny4"), num_hidden_layers=NUM_LAYERS)
    return load_model(path, "float32")


@pytest.fixture(scope="module")
def reference(tiny4: LoadedModel) -> list[list[int]]:
    requests, _ = run_engine(tiny_executor(tiny4, device_blocks=128), PROMPTS, NUM_TOKENS)
    return [list(r.output_token_ids) for r in requests]


class Cluster:
    """Two (or more) started local instances and what they reported."""

    def __init__(self, model: LoadedModel, num: int, device_blocks: int) -> None:
        self.clock = MonotonicClock()
        config = SchedulerConfig(max_model_len=512, max_num_batched_tokens=512)
        self.instances = [
            LocalInstance(InstanceWorker(i, build_engine(
                tiny_executor(model, device_blocks=device_blocks), self.clock, "vllm", config)))
            for i in range(num)]
        self.finished: set[str] = set()
        self.down: list[int] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        for inst in self.instances:
            inst.start(self._post, self._on_down)

    def _post(self, message: StepMessage) -> None:
        with self._lock:
            self.finished.update(message.finished_ids)

    def _on_down(self, index: int, cause: BaseException | None) -> None:
        self.down.append(index)

    def stop(self) -> None:
        for inst in self.instances:
            inst.stop()

    def submit(self, index: int, requests: list[Request]) -> None:
        for req in requests:
            self.instances[index].submit(req)


@pytest.fixture
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(model: LoadedModel, num: int = 2, device_blocks: int = 48) -> Cluster:
        cluster = Cluster(model, num, device_blocks)
        made.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


def _requests(prefix: str = "r") -> list[Request]:
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    return [Request(f"{prefix}{i}", p, params, time.monotonic()) for i, p in enumerate(PROMPTS)]


def _wait(condition: Callable[[], Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def _all_running(requests: list[Request], min_tokens: int = 2) -> bool:
    return all(r.num_output_tokens >= min_tokens for r in requests)


def _serving_on_both(cluster: Any) -> list[Request]:
    """The four requests, two on each instance, each past its first tokens."""
    requests = _requests()
    cluster.submit(0, requests[:2])
    cluster.submit(1, requests[2:])
    _wait(lambda: _all_running(requests))
    return requests


def test_form_and_restore_keep_greedy_outputs(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4, device_blocks=96)  # the leader alone holds all four
    requests = _serving_on_both(cluster)
    groups = LocalPipelineGroups(cluster.instances, LocalGroupOptions(
        exchange_bytes_per_step=4096, exchange_chunk_blocks=1))
    assert groups.form_group(HALVES)
    leader, member = (inst.worker for inst in cluster.instances)
    assert isinstance(leader.engine.executor, PipelineExecutor)
    form = groups.form_reports[-1]
    assert form.num_adopted == 4 and form.num_recomputed == 0
    assert form.kv_blocks_after > 2 * form.kv_blocks_before[0]  # the dropped weights
    assert member.engine.scheduler.kv.num_device_blocks == 0
    assert groups.groups() == [HALVES] and not groups.accepting(1)
    progress = {r.request_id: r.num_output_tokens for r in requests}
    _wait(lambda: form.exchange_seconds is not None)
    assert form.kv_bytes_exchanged > 0 and form.kv_bytes_local > 0
    _wait(lambda: all(r.num_output_tokens >= progress[r.request_id] + 3 for r in requests))
    assert groups.dissolve_group(0)
    restore = groups.restore_reports[-1]
    assert restore.num_recomputed == 0 and restore.kv_bytes_back > 0
    assert restore.weight_bytes_reloaded == form.weight_bytes_dropped
    assert restore.kv_blocks_after == form.kv_blocks_before
    assert not isinstance(leader.engine.executor, PipelineExecutor) and groups.accepting(1)
    # the group stepped on the overlapped loop; restored, the leader steps whole again
    assert isinstance(leader.loop, GroupLoop) and leader.loop.overlapped is None
    assert leader.loop.num_overlapped > 0
    _wait(lambda: all(r.is_finished for r in requests))
    assert [list(r.output_token_ids) for r in requests] == reference
    assert all(r.timeline.num_recomputes == 0 for r in requests)  # KV moved, not recomputed
    _wait(lambda: not leader.engine.has_work)
    for worker in (leader, member):
        kv = worker.engine.scheduler.kv
        kv.check_invariants()
        assert kv.num_free_device_blocks == kv.num_device_blocks  # every block came back


def test_partner_serves_alone_after_restore(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4)
    groups = LocalPipelineGroups(cluster.instances)
    assert groups.form_group(HALVES)
    late = _requests("late")
    cluster.submit(1, late[:2])  # routed to the member: it forwards to the leader
    _wait(lambda: _all_running(late[:2]))
    assert not cluster.instances[1].worker.engine.scheduler.requests
    assert groups.dissolve_group(0)
    cluster.submit(1, late[2:])  # the partner serves again on its own
    _wait(lambda: all(r.is_finished for r in late))
    assert [list(r.output_token_ids) for r in late] == reference
    assert cluster.finished >= {r.request_id for r in late}


@pytest.mark.slow
def test_a_group_on_stage_processes_keeps_greedy_outputs(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4, device_blocks=96)
    requests = _serving_on_both(cluster)
    groups = LocalPipelineGroups(cluster.instances, LocalGroupOptions(
        stage_workers="process"))
    assert groups.form_group(HALVES)
    leader = cluster.instances[0].worker
    pipeline = leader.engine.executor
    assert isinstance(pipeline, PipelineExecutor) and pipeline.stage_workers == "process"
    loop = leader.loop
    assert isinstance(loop, GroupLoop) and loop.overlapped is not None
    _wait(lambda: all(r.num_output_tokens >= 40 for r in requests))
    # the process stages served the group's steps (whether two of them overlapped
    # depends on timing here; the thread-stage test checks the overlap)
    assert loop.overlapped is not None and loop.overlapped.num_steps > 0
    assert groups.dissolve_group(0)  # drained, then the KV comes back from shared pools
    assert groups.restore_reports[-1].num_recomputed == 0
    _wait(lambda: all(r.is_finished for r in requests))
    assert [list(r.output_token_ids) for r in requests] == reference


def test_an_abort_in_a_served_group_frees_its_blocks(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4, device_blocks=96)
    requests = _serving_on_both(cluster)
    groups = LocalPipelineGroups(cluster.instances)
    assert groups.form_group(HALVES)
    leader = cluster.instances[0].worker
    assert isinstance(leader.loop, GroupLoop) and leader.loop.overlapped is not None
    victim = requests[1]
    _wait(lambda: victim.num_output_tokens >= 8)
    cluster.instances[0].abort(victim.request_id)  # the leader serves it now
    _wait(lambda: victim.request_id in cluster.finished)
    assert victim.is_finished and victim.num_output_tokens < NUM_TOKENS
    assert list(victim.output_token_ids) == reference[1][:victim.num_output_tokens]
    others = [r for i, r in enumerate(requests) if i != 1]
    _wait(lambda: all(r.is_finished for r in others))
    assert [list(r.output_token_ids) for r in others] == \
        [t for i, t in enumerate(reference) if i != 1]
    _wait(lambda: not leader.engine.has_work and not leader.engine.scheduler.has_in_flight)
    assert groups.dissolve_group(0)  # drains, restores over the freed blocks
    kv = leader.engine.scheduler.kv
    kv.check_invariants()
    assert kv.num_free_device_blocks == kv.num_device_blocks


def test_recompute_mode_moves_no_kv(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4)
    requests = _serving_on_both(cluster)
    groups = LocalPipelineGroups(cluster.instances)
    plan = GroupPlan((1, 0), ((0, 1), (1, 4)), kv_mode="recompute")  # member 1 leads
    assert groups.form_group(plan)
    form = groups.form_reports[-1]
    assert form.num_recomputed == 4 and form.kv_bytes_exchanged == 0
    _wait(lambda: all(r.is_finished for r in requests))
    assert [list(r.output_token_ids) for r in requests] == reference


def _kill(worker: InstanceWorker) -> None:
    def fail(_w: InstanceWorker) -> None:
        raise RuntimeError("test hook: this instance's thread dies")
    worker.at_boundary(fail)


def test_failed_member_makes_the_leader_restore(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4, device_blocks=96)
    requests = _serving_on_both(cluster)
    groups = LocalPipelineGroups(cluster.instances)
    assert groups.form_group(HALVES)
    recomputes = [r.timeline.num_recomputes for r in requests]
    _kill(cluster.instances[1].worker)
    _wait(lambda: groups.restore_reports)
    restore = groups.restore_reports[-1]
    assert cluster.down == [1] and restore.failed_member == 1
    assert not groups.groups()
    _wait(lambda: all(r.is_finished for r in requests))
    # no request lost: every one that held KV was re-queued (recomputed) and completed
    unfinished_at_failure = restore.num_recomputed
    assert unfinished_at_failure == 4
    assert [r.timeline.num_recomputes for r in requests] == [n + 1 for n in recomputes]
    assert [list(r.output_token_ids) for r in requests] == reference
    assert cluster.finished >= {r.request_id for r in requests}


def test_failed_leader_gives_members_engines_back(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4)
    requests = _requests()
    cluster.submit(1, requests[:2])
    _wait(lambda: _all_running(requests[:2]))
    groups = LocalPipelineGroups(cluster.instances)
    assert groups.form_group(HALVES)
    assert not cluster.instances[1].alive and cluster.instances[1].running
    _kill(cluster.instances[0].worker)
    member = cluster.instances[1]
    _wait(lambda: isinstance(member.worker.engine.executor, TorchExecutor))
    assert member.alive and cluster.down == [0] and not groups.groups()
    # the dead leader's requests (the member's among them) are the controller's to
    # re-queue or fail (Controller.instance_failed); the member serves new ones
    dead = cluster.instances[0].worker.engine.scheduler
    assert {r.request_id for r in requests[:2]} <= set(dead.requests)
    cluster.submit(1, requests[2:])
    _wait(lambda: all(r.is_finished for r in requests[2:]))
    assert [list(r.output_token_ids) for r in requests[2:]] == reference[2:]


def test_background_prepare_forms_when_asked_again(tiny4, reference, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4)
    requests = _requests()
    cluster.submit(0, requests[:1])
    cluster.submit(1, requests[1:2])
    _wait(lambda: _all_running(requests[:2]))
    groups = LocalPipelineGroups(cluster.instances, LocalGroupOptions(
        background_prepare=True, background_restore=True))
    assert not groups.form_group(HALVES)  # the stages are being built
    _wait(lambda: groups.form_group(HALVES))
    assert groups.groups() == [HALVES] and groups.form_reports[-1].prepare_seconds > 0
    assert groups.dissolve_group(0)  # returns at once; the restore follows
    _wait(lambda: not groups.groups())
    _wait(lambda: all(r.is_finished for r in requests[:2]))
    assert [list(r.output_token_ids) for r in requests[:2]] == reference[:2]


def test_a_formation_that_fails_closes_its_pipeline(tiny4, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4)
    groups = LocalPipelineGroups(cluster.instances, LocalGroupOptions())
    built: list[PipelineExecutor] = []
    prepare = groups._prepare

    def prepare_then_swap(plan: GroupPlan):  # type: ignore[no-untyped-def]
        prepared = prepare(plan)
        built.append(prepared[1])
        member = cluster.instances[1].worker  # idle: a new executor between its steps
        member.engine.executor = tiny_executor(tiny4, device_blocks=48)
        return prepared

    groups._prepare = prepare_then_swap  # type: ignore[method-assign]
    assert built == [] and not groups.form_group(HALVES)  # an executor changed meanwhile
    assert len(built) == 1 and built[0]._stream is None  # its stage workers stopped
    assert cluster.instances[0].worker.engine.executor is not built[0]
    assert groups.groups() == []


def test_stages_prepared_for_another_plan_are_closed(tiny4, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(tiny4)
    groups = LocalPipelineGroups(cluster.instances, LocalGroupOptions(background_prepare=True))
    assert not groups.form_group(HALVES)
    _wait(lambda: groups._prepared is not None)
    assert groups._prepared is not None
    dropped = groups._prepared[1][1]
    assert dropped._stream is not None  # started while the members serve
    other = GroupPlan((0, 1), ((0, 1), (1, 4)))
    assert not groups.form_group(other)  # HALVES' stages are dropped
    _wait(lambda: dropped._stream is None)
    _wait(lambda: groups.form_group(other))
    assert groups.groups() == [other]
    formed = cluster.instances[0].worker.engine.executor
    assert isinstance(formed, PipelineExecutor) and formed is not dropped


def test_stages_and_rebuilds_take_the_executors_thread_count(tiny4) -> None:  # type: ignore[no-untyped-def]
    """The group's stages split the leader executor's resolved thread count, not the
    count the forming thread has now (1 after a small step); a member rebuilt from its
    origin on a new thread (which starts at the count some thread set last) gets its
    executor's count back."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        executors = {m: tiny_executor(tiny4, device_blocks=48) for m in (0, 1)}
        assert executors[0].num_threads == 2 and executors[0].options.num_threads is None
        torch.set_num_threads(1)
        pipeline = build_pipeline(HALVES, executors, pipelined=False)
        assert pipeline.num_threads == 2 and pipeline.options.num_threads == 2
        assert pipeline.stage_thread_count() == 1
        origin = Origin.of(executors[1])
        assert origin.options.num_threads == 2
        rebuilt: list[TorchExecutor] = []
        thread = threading.Thread(target=lambda: rebuilt.append(origin.build()))
        thread.start()  # (its count starts at 1, the last one set)
        thread.join()
        assert rebuilt[0].num_threads == 2
    finally:
        torch.set_num_threads(before)
