"""KunServe on in-process engines: a formed pipeline group grows when a solo instance
joins it (the leader keeps leading, its stages re-split by andante.exec.torch_regroup,
the joiner's requests adopted with their KV), shrinks by one (that member serves alone
again) and restores; greedy outputs stay those of the unsplit model throughout."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from andante.cluster.kunserve.coordinator import KunServeCoordinator
from andante.cluster.kunserve.monitor import MonitorOptions
from andante.cluster.kunserve.seam import GroupPlan
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_pipeline import PipelineExecutor
from andante.models import load_model
from andante.models.loader import LoadedModel
from andante.runtime.kunserve import LocalGroupOptions, LocalPipelineGroups
from andante.runtime.kunserve_loop import GroupLoop
from andante.runtime.kunserve_stages import layer_memory
from tests.cluster.kunserve.test_coordinator_resize import FakeController, Slot
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.helpers import make_tiny_checkpoint
from tests.runtime.test_kunserve_local import (
    NUM_TOKENS,
    PROMPTS,
    Cluster,
    _all_running,
    _requests,
    _wait,
)

NUM_LAYERS = 6  # three members hold 2 layers each: the leader drops more than in a pair
HALVES = GroupPlan((0, 1), ((0, 3), (3, 6)))
THREE = GroupPlan((0, 1, 2), ((0, 2), (2, 4), (4, 6)))  # balanced_slices(3, 6)


@pytest.fixture(scope="module")
def tiny6(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny6g"), num_hidden_layers=NUM_LAYERS)
    return load_model(path, "float32")


@pytest.fixture(scope="module")
def reference(tiny6: LoadedModel) -> list[list[int]]:
    requests, _ = run_engine(tiny_executor(tiny6, device_blocks=128), PROMPTS, NUM_TOKENS)
    return [list(r.output_token_ids) for r in requests]


@pytest.fixture
def three(tiny6: LoadedModel) -> Iterator[Cluster]:
    cluster = Cluster(tiny6, 3, device_blocks=96)
    cluster.start()
    yield cluster
    cluster.stop()


def _progress_by(requests: list, extra: int) -> Callable[[], bool]:  # type: ignore[type-arg]
    marks = {r.request_id: r.num_output_tokens for r in requests}
    return lambda: all(r.is_finished or r.num_output_tokens >= marks[r.request_id] + extra
                       for r in requests)


def test_a_group_grows_shrinks_by_one_and_restores_with_greedy_outputs(  # type: ignore[no-untyped-def]
        reference, three) -> None:
    group_reqs, solo_reqs = _requests("g"), _requests("s")
    three.submit(0, group_reqs[:2])
    three.submit(1, group_reqs[2:])
    three.submit(2, solo_reqs)
    _wait(lambda: _all_running(group_reqs + solo_reqs))
    groups = LocalPipelineGroups(three.instances, LocalGroupOptions(
        exchange_bytes_per_step=4096, exchange_chunk_blocks=1))
    assert groups.form_group(HALVES)
    _wait(_progress_by(group_reqs, 3))
    assert groups.form_group(THREE)  # the grow: 2 joins, 0 keeps leading
    grow = groups.form_reports[-1]
    leader = three.instances[0].worker
    pipeline = leader.engine.executor
    assert isinstance(pipeline, PipelineExecutor)
    assert [s.layers_range for s in pipeline.stages] == list(THREE.layer_slices)
    assert groups.groups() == [THREE] and not groups.accepting(2)
    assert grow.num_adopted == 8 and grow.num_recomputed == 0  # the group's 4, the solo's 4
    assert grow.kv_blocks_after > grow.kv_blocks_before[0]  # a third member's memory
    assert all(s.kv.num_device_blocks == grow.kv_blocks_after for s in pipeline.stages)
    assert set(leader.engine.scheduler.requests) >= {r.request_id for r in solo_reqs
                                                     if not r.is_finished}
    assert three.instances[2].worker.engine.scheduler.kv.num_device_blocks == 0
    _wait(lambda: grow.exchange_seconds is not None)
    assert grow.kv_bytes_exchanged > 0  # the joiner's requests' KV crossed to the stages
    loop = leader.loop
    assert isinstance(loop, GroupLoop) and loop.overlapped is not None
    overlapped_at_grow = loop.num_overlapped
    _wait(_progress_by(group_reqs + solo_reqs, 3))
    assert loop.num_overlapped > overlapped_at_grow  # three stages, steps overlapping
    assert groups.shrink_group(0)  # instance 2 goes: the pair takes its layers back
    assert groups.groups() == [HALVES] and groups.accepting(2)
    assert [s.layers_range for s in pipeline.stages] == list(HALVES.layer_slices)
    pair_blocks = leader.engine.scheduler.kv.num_device_blocks
    assert pair_blocks == grow.kv_blocks_before[0] < grow.kv_blocks_after
    assert all(s.kv.num_device_blocks == pair_blocks for s in pipeline.stages)
    released = three.instances[2].worker.engine
    assert isinstance(released.executor, TorchExecutor)
    assert released.scheduler.kv.num_device_blocks == 96
    _wait(_progress_by(group_reqs + solo_reqs, 3))
    assert groups.dissolve_group(0)
    restore = groups.restore_reports[-1]
    assert restore.kv_blocks_after == {0: 96, 1: 96}
    assert all(isinstance(i.worker.engine.executor, TorchExecutor) for i in three.instances)
    _wait(lambda: all(r.is_finished for r in group_reqs + solo_reqs))
    assert [list(r.output_token_ids) for r in group_reqs] == reference
    assert [list(r.output_token_ids) for r in solo_reqs] == reference
    assert all(r.timeline.num_recomputes == 0 for r in group_reqs + solo_reqs)
    _wait(lambda: not leader.engine.has_work)
    for inst in three.instances:
        kv = inst.worker.engine.scheduler.kv
        kv.check_invariants()
        assert kv.num_free_device_blocks == kv.num_device_blocks


def test_a_grow_that_reorders_or_splits_the_group_is_refused(  # type: ignore[no-untyped-def]
        three) -> None:
    groups = LocalPipelineGroups(three.instances)
    assert groups.form_group(HALVES)
    assert not groups.form_group(GroupPlan((2, 0, 1), THREE.layer_slices))  # 2 would lead
    assert not groups.form_group(GroupPlan((0, 2, 1), THREE.layer_slices))  # reordered
    assert groups.groups() == [HALVES]


def test_the_coordinator_grows_a_pressed_group_then_shrinks_it(  # type: ignore[no-untyped-def]
        reference, three) -> None:
    """The shared coordinator decides (its load figures set by the test: the leader
    pressed, then not), the real engine carries the grow and the shrink out."""
    requests = _requests("c")
    three.submit(0, requests[:2])
    three.submit(2, requests[2:])
    _wait(lambda: _all_running(requests))
    groups = LocalPipelineGroups(three.instances)
    assert groups.form_group(HALVES)
    solo = three.instances[2].worker.engine.executor
    assert isinstance(solo, TorchExecutor)
    options = MonitorOptions(check_interval=0.0, decode_tokens=0, min_group_seconds=0.0,
                             restore_window_seconds=0.0, idle_restore_seconds=1e9)
    coordinator = KunServeCoordinator(groups, layer_memory(solo), 16, options)
    controller = FakeController([Slot(0), Slot(1), Slot(2)])
    pair_blocks = three.instances[0].worker.engine.scheduler.kv.num_device_blocks
    controller.set(0, 1.0, used=pair_blocks, blocks=pair_blocks, waiting=4, queued=50)
    controller.set(1, 1.0, used=0, blocks=0)
    controller.set(2, 1.0, used=4, blocks=96)
    coordinator.after_step(controller)  # type: ignore[arg-type]
    assert groups.groups() == [THREE] and (2, 0) in controller.reassigned
    assert coordinator.counters.num_drops == 1
    _wait(_progress_by(requests, 3))
    # the pressure falls below half of the pair's blocks, above half of one instance's
    controller.set(0, 2.0, used=60, blocks=groups.form_reports[-1].kv_blocks_after)
    coordinator.after_step(controller)  # type: ignore[arg-type]
    assert coordinator.counters.num_shrinks == 1 and groups.groups() == [HALVES]
    assert groups.accepting(2) and coordinator.counters.num_restores == 0
    _wait(lambda: all(r.is_finished for r in requests))
    assert [list(r.output_token_ids) for r in requests] == reference
