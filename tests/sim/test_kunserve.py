"""KunServe on the simulator: drop under a burst, restore after it, a member's failure."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from andante.cluster.controller import Controller
from andante.cluster.kunserve.seam import GroupPlan
from andante.core.request import Request, RequestStatus
from andante.engine.config import SchedulerConfig
from andante.sim.kunserve_instance import KunSimInstance
from andante.sim.setup import build_simulator
from andante.sim.spec import ClusterSpec
from andante.workload.spec import RequestSpec, to_requests


def _spec(num_instances: int = 2, **options: object) -> ClusterSpec:
    return ClusterSpec(
        model="llama-3.1-8b", hardware="a10-24g", num_instances=num_instances,
        router="kunserve", router_options={"check_interval": 0.02, **options},
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=128,
                                  max_model_len=8192))


def _burst(num: int = 120) -> list[RequestSpec]:
    """A burst whose KV outgrows one A10 instance, then a trickle after it."""
    burst = [RequestSpec(0.01 * i, 400, 300) for i in range(num)]
    tail = [RequestSpec(40.0 + 2.0 * i, 100, 20) for i in range(10)]
    return burst + tail


def _run(spec: ClusterSpec, specs: list[RequestSpec], operator: object = None
         ) -> tuple[list[Request], dict[str, int], object]:
    sim = build_simulator(spec)
    if operator is not None:
        sim.controller.operators.append(operator)  # type: ignore[arg-type]
    requests = to_requests(specs)
    report = sim.run(requests)
    assert not report.unfinished
    for inst in sim.instances:
        inst.engine.scheduler.kv.check_invariants()
    return requests, report.router_counters, sim


def test_burst_drops_then_restores_and_every_request_completes() -> None:
    # (without the restore window: the trickle after the burst lasts 20 s)
    requests, counters, sim = _run(_spec(restore_window_seconds=0.0), _burst())
    assert counters["num_drops"] >= 1 and counters["num_restores"] >= 1
    assert counters["num_adopted_running"] > 0 and counters["kv_bytes_exchanged"] > 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    assert all(r.num_output_tokens == r.sampling.max_tokens for r in requests)
    instances: list[KunSimInstance] = sim.instances  # type: ignore[attr-defined, assignment]
    assert all(not i.grouped and i.alive for i in instances)  # restored at the end
    whole = instances[0].engine.scheduler.kv.num_device_blocks
    assert all(i.engine.scheduler.kv.num_device_blocks == whole for i in instances)


def test_recompute_mode_moves_no_kv() -> None:
    requests, counters, _ = _run(_spec(kv_mode="recompute"), _burst())
    assert counters["num_drops"] >= 1 and counters["num_recomputed_running"] > 0
    assert counters["num_adopted_running"] == 0  # (restores still move KV back)
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)


def test_without_drop_nothing_groups() -> None:
    _, counters, _ = _run(_spec(drop=False), _burst(60))
    assert counters["num_drops"] == 0 and counters["num_checks"] == 0


@dataclass
class FailOnce:
    """A cluster operator that fails member 1 of the first group it sees."""

    coordinator: object
    outcome: list[object] = field(default_factory=list)

    def after_step(self, controller: Controller) -> None:
        groups = self.coordinator.groups.groups()  # type: ignore[attr-defined]
        if self.outcome or not groups:
            return
        member = groups[0].members[-1]
        self.outcome.append(self.coordinator.member_failed(  # type: ignore[attr-defined]
            controller, member))


def test_a_failed_member_makes_its_partner_restore_and_loses_no_request() -> None:
    spec = _spec()
    sim = build_simulator(spec)
    coordinator = sim.controller.operators[0]
    failer = FailOnce(coordinator)
    sim.controller.operators.append(failer)  # type: ignore[arg-type]
    requests = to_requests(_burst())
    report = sim.run(requests)
    assert failer.outcome, "no group formed"
    finished = {r.request_id: r for r in report.finished}
    assert not report.unfinished and len(finished) == len(requests)  # none lost
    failed = [r for r in finished.values() if r.status == RequestStatus.FINISHED_ABORTED]
    completed = [r for r in finished.values() if r.status == RequestStatus.FINISHED_LENGTH]
    counters = report.router_counters
    assert counters["num_failures"] == 1
    assert len(failed) == counters["num_failed_requests"] > 0
    assert all("pipeline group failed" in (r.timeline.rejection_reason or "") for r in failed)
    assert counters["num_requeued"] > 0  # not started: served again, by the partner
    assert len(failed) + len(completed) == len(requests)
    survivors = [i for i in sim.instances if i.alive]
    assert len(survivors) == 1 and not survivors[0].grouped  # type: ignore[attr-defined]


def test_form_group_refuses_plans_it_cannot_carry_out() -> None:
    sim = build_simulator(_spec(num_instances=3))
    groups = sim.controller.router.counters.groups  # type: ignore[attr-defined]
    layers = groups.memory.num_layers
    assert not groups.form_group(GroupPlan((0, 5), ((0, 8), (8, layers))))  # no instance 5
    assert not groups.form_group(GroupPlan((0, 1), ((0, 8), (8, layers - 1))))  # wrong L
    assert groups.form_group(GroupPlan((0, 1), ((0, 16), (16, layers))))
    assert not groups.form_group(GroupPlan((2, 1), ((0, 16), (16, layers))))  # splits 0-1
    assert groups.dissolve_group(0) and not groups.dissolve_group(2)


def test_llumnix_like_baseline_migrates_and_loses_nothing() -> None:
    spec = ClusterSpec(
        model="llama-3.1-8b", hardware="a10-24g", num_instances=2, router="llumnix",
        router_options={},
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=128,
                                  max_model_len=8192))
    # dispatch alternates at one instant: long requests pile up on one instance
    specs = [RequestSpec(0.0, 400, 1200 if i % 2 == 0 else 5) for i in range(80)]
    requests, counters, _ = _run(spec, specs)
    assert counters["num_running_migrations"] + counters["num_waiting_migrations"] > 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)


@dataclass(slots=True)
class _GroupRunning:
    """Records the largest running set of a grouped leader, and its budgets."""

    most_running: int = 0
    seq_caps: set[int] = field(default_factory=set)
    scales: set[float] = field(default_factory=set)

    def after_step(self, controller: Controller) -> None:
        for slot in controller.slots:
            inst = slot.instance
            if isinstance(inst, KunSimInstance) and inst.grouped:
                scheduler = inst.engine.scheduler
                self.most_running = max(self.most_running, len(scheduler.running))
                self.seq_caps.add(scheduler.config.max_num_seqs)
                self.scales.add(inst.seq_scale)


def test_a_group_admits_past_one_instances_sequence_cap() -> None:
    spec = dataclasses.replace(_spec(), scheduler=SchedulerConfig(
        max_num_batched_tokens=2048, max_num_seqs=48, max_model_len=8192))
    watch = _GroupRunning()
    requests, counters, _ = _run(spec, _burst(200), watch)
    assert counters["num_drops"] >= 1
    # lookahead caps tokens, never the running set; the group's KV (the dropped weights'
    # memory added) holds more sequences than its members' caps together
    (scale,) = watch.scales
    assert scale > 1 and watch.seq_caps == {math.ceil(2 * 48 * scale)}
    assert watch.most_running > 2 * 48
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
