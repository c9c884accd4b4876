from __future__ import annotations

import pytest

from andante.cluster import Controller, UnsupportedOperation
from andante.cluster.instance import BASIC_CAPABILITIES, EVICT, Instance
from andante.cluster.load import predicted_drain_time, total_stats
from andante.cluster.router import RoundRobinRouter
from andante.core.request import RequestStatus
from andante.engine.engine import Engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.runtime.worker import InstanceWorker
from andante.server.backend import build_backend
from andante.sim import ClusterSpec
from andante.sim.setup import build_simulator
from tests.cluster.fakes import FakeInstance, request
from tests.engine.helpers import make_engine, make_request
from tests.server.helpers import toy_options


class HoldingRouter(RoundRobinRouter):
    """Places nothing while `hold` is set (a pull-model router)."""

    hold = True

    def route(self, req, instances):  # type: ignore[no-untyped-def]
        return None if self.hold else super().route(req, instances)


def _cluster(n: int = 2, router=None):  # type: ignore[no-untyped-def]
    instances = [FakeInstance(i) for i in range(n)]
    return Controller(instances, router or RoundRobinRouter()), instances


def test_submit_routes_and_tracks_owners() -> None:
    ctl, insts = _cluster()
    for i in range(3):
        ctl.submit(request(f"r{i}"))
    assert [len(i.submitted) for i in insts] == [2, 1]
    assert ctl.owner_of("r1") == 1 and ctl.num_owned == 3
    ctl.on_step(0, finished_ids=["r0"])
    assert ctl.owner_of("r0") is None and ctl.num_owned == 2
    assert ctl.abort("r1") and insts[1].aborted == ["r1"]
    assert not ctl.abort("unknown")


def test_global_queue_waits_until_the_router_accepts() -> None:
    router = HoldingRouter()
    ctl, insts = _cluster(router=router)
    ctl.submit(request("a"))
    ctl.submit(request("b"))
    assert [r.request_id for r in ctl.queue] == ["a", "b"]
    assert ctl.abort("b") and [r.request_id for r in ctl.queue] == ["a"]
    router.hold = False
    ctl.on_step(0)
    assert not ctl.queue and insts[0].submitted[0].request_id == "a"


def test_handoffs_go_where_the_router_or_a_migration_says() -> None:
    ctl, insts = _cluster(3)
    for i in range(3):
        ctl.submit(request(f"r{i}"))
    req0 = insts[0].submitted[0]
    ctl.on_step(0, handoffs=[req0])  # default: the least-loaded other instance
    assert ctl.owner_of("r0") in (1, 2) and ctl.num_handoffs == 1
    assert ctl.migrate("r1", 2) and insts[1].withdrawn == ["r1"]
    assert not ctl.migrate("r1", 1)  # already owned by 1... and a move is pending
    ctl.on_handoff(1, [insts[1].submitted[0]])
    assert ctl.owner_of("r1") == 2


def test_dead_instance_requeues_unstarted_requests_and_fails_started_ones() -> None:
    ctl, insts = _cluster(2)
    for i in range(4):
        ctl.submit(request(f"r{i}"))
    insts[0].submitted[0].append_output_token(7, 0.0)  # r0 mutated by its engine
    outcome = ctl.instance_failed(0, started=lambda rid: rid == "r0")
    assert outcome.failed == ["r0"] and outcome.requeued == ["r2"]
    moved = insts[1].submitted[-1]
    assert moved.request_id == "r2" and not moved.output_token_ids
    assert moved is not insts[0].submitted[1]  # a fresh copy, not the dead engine's object
    ctl.submit(request("r4"))  # instance 0 is down: everything goes to 1
    assert ctl.owner_of("r4") == 1
    ctl.instance_recovered(0)
    ctl.submit(request("r5"))
    assert ctl.owner_of("r5") == 0


@pytest.mark.parametrize("make", ["sim", "local"])
def test_real_instances_offer_only_the_basic_operations(make: str) -> None:
    """The instances the simulator and the server run (not a fake) advertise exactly
    the operations they implement and refuse the later ones clearly."""
    inst: Instance = (build_simulator(ClusterSpec()).instances[0] if make == "sim"
                      else build_backend(toy_options()).runner.instances[0])
    assert inst.capabilities == BASIC_CAPABILITIES | {EVICT}  # QLM's agents evict
    for operation in (lambda: inst.swap_model("other"), lambda: inst.drop_layers([0, 1]),
                      inst.restore_layers):
        with pytest.raises(UnsupportedOperation, match=type(inst).__name__):
            operation()


def test_instance_indices_must_count_from_zero() -> None:
    with pytest.raises(ValueError, match="indices"):
        Controller([FakeInstance(1)], RoundRobinRouter())


def test_the_simulator_reports_a_refused_request_once() -> None:
    """A request refused by its engine (`Engine.submit`) is finished as rejected and
    reported at once, not again with the engine's next step output."""
    sim = build_simulator(ClusterSpec())
    reqs = [request("ok", arrival=0.0), request("huge", prompt=10**7, arrival=0.0),
            request("after", arrival=0.001)]
    seen: list[str] = []
    report = sim.run(reqs, on_finish=lambda r: seen.append(r.request_id))
    assert sorted(seen) == ["after", "huge", "ok"]
    assert sorted(r.request_id for r in report.finished) == ["after", "huge", "ok"]
    assert reqs[1].status == RequestStatus.FINISHED_REJECTED
    assert sim.controller.num_owned == 0


def test_a_worker_reports_a_refused_request_once() -> None:
    engine, _, _ = make_engine("vllm", num_device_blocks=4)
    worker = InstanceWorker(0, engine)
    worker.submit(make_request("huge", 40, 1))
    worker.submit(make_request("ok", 4, 2))
    finished: list[str] = []
    while (message := worker.step()) is not None:
        finished += message.finished_ids
    assert sorted(finished) == ["huge", "ok"]
    assert worker.load().num_received == 2 and not engine.has_work


def _drain_per_request(cost: CostModel, engine: Engine, mean: float) -> float:
    """The per-request form the closed form approximates (andante.cluster.load)."""
    reqs = list(engine.scheduler.requests.values())
    left = [min(r.num_remaining_output_tokens, max(1.0, mean - r.num_output_tokens))
            for r in reqs]
    batch = min(len(reqs), engine.scheduler.config.max_num_seqs)
    prefill = sum(max(0, r.num_uncomputed_tokens - 1) for r in reqs)
    per_token = cost.prefill_time(1024) / 1024
    step = cost.decode_time(batch, sum(r.num_tokens for r in reqs) // len(reqs))
    return prefill * per_token + max(max(left), sum(left) / batch) * step


def test_drain_time_from_the_stats_matches_the_per_request_form() -> None:
    """Exact while every request expects between 1 and its max_tokens left more tokens
    and one of them has none yet (the cases where the closed form may differ: the
    module note of andante.cluster.load)."""
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    engine, _, clock = make_engine("vllm", num_device_blocks=64, max_num_seqs=2)
    for i in range(4):
        engine.add_request(make_request(f"r{i}", 10 + 3 * i, 300))
    assert predicted_drain_time(cost, engine.stats(), 256.0) == pytest.approx(
        _drain_per_request(cost, engine, 256.0))
    for _ in range(5):  # now some requests are ahead of others
        clock.advance_to(clock.now() + 0.01)
        engine.step()
    engine.add_request(make_request("late", 8, 300))
    assert predicted_drain_time(cost, engine.stats(), 256.0) == pytest.approx(
        _drain_per_request(cost, engine, 256.0))
    assert predicted_drain_time(cost, total_stats([]), 256.0) == 0.0
