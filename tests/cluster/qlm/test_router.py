"""The `qlm` router wired to the controller and the simulated cluster."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from andante.cluster.controller import Controller
from andante.cluster.instance import SWAP_MODEL
from andante.cluster.qlm.eviction import preemption_mode
from andante.cluster.qlm.router import QLMRouter
from andante.cluster.registry import make_router
from andante.cluster.router import QueueDecision
from andante.core.request import PreemptionMode, Request
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.sim import ClusterSpec, simulate
from andante.sim.setup import with_router
from andante.workload.mixes import assign_deadlines, assign_models
from andante.workload.spec import RequestSpec
from tests.cluster.fakes import FakeInstance, request

MODELS = ("mistral-7b", "llama-3.1-8b", "vicuna-13b")


class ScriptedHolder:
    """A queue-holding router that answers one scripted decision."""

    name = "scripted"

    def __init__(self, decision: QueueDecision) -> None:
        self.decision = decision
        self.finished: list[str] = []

    def route(self, req: Request, instances: Sequence[Any]) -> int | None:
        raise AssertionError("a queue-holding router is never asked to route")

    def place_handoff(self, req: Request, source: int, instances: Sequence[Any]) -> None:
        return None

    def dispatch(self, queue: Sequence[Request], instances: Sequence[Any]) -> QueueDecision:
        decision, self.decision = self.decision, QueueDecision()
        return decision

    def on_finished(self, req: Request) -> None:
        self.finished.append(req.request_id)


class SwappingFake(FakeInstance):
    capabilities = FakeInstance.capabilities | {SWAP_MODEL}

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.models: list[str] = []

    def swap_model(self, model: str) -> None:
        self.models.append(model)


def test_controller_applies_a_queue_routers_decision() -> None:
    instances = [SwappingFake(0), SwappingFake(1)]
    holder = ScriptedHolder(QueueDecision())
    controller = Controller(instances, holder)
    assert controller.holds_queue
    controller.submit(request("a"))
    controller.submit(request("b"))
    assert [r.request_id for r in controller.queue] == ["a", "b"]  # held
    holder.decision = QueueDecision(placements=(("b", 1), ("zz", 0)), swaps=((0, "m2"),))
    controller.dispatch_queue()
    assert [r.request_id for r in instances[1].submitted] == ["b"]
    assert [r.request_id for r in controller.queue] == ["a"]
    assert instances[0].models == ["m2"] and controller.num_model_swaps == 1
    controller.on_finished("b")
    assert holder.finished == ["b"]


def test_qlm_is_registered_with_its_knobs() -> None:
    router = make_router("qlm", {"delta": 2.0, "warm_start": False})
    assert isinstance(router, QLMRouter) and router.options.delta == 2.0
    with pytest.raises(ValueError, match="avg_batch must be >= 1"):
        make_router("qlm", {"avg_batch": 0})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['colour'\]"):
        make_router("qlm", {"colour": 1})


def test_preemption_mode_follows_the_cost_of_each() -> None:
    """Insight #2 per request: on an A100 Mistral-7B's small KV is swapped, Vicuna-13B's
    evicted (the paper's Fig. 4); a slow host link evicts Mistral too; a full host
    budget refuses the swap."""
    a100 = get_hardware("a100-80g")
    mistral = CostModel(get_model("mistral-7b"), a100)
    assert preemption_mode(mistral, 1024) is PreemptionMode.SWAP
    assert preemption_mode(CostModel(get_model("vicuna-13b"), a100), 1024) \
        is PreemptionMode.RECOMPUTE
    slow = CostModel(get_model("mistral-7b"), dataclasses.replace(a100, host_link_bandwidth=1e8))
    assert preemption_mode(slow, 1024) is PreemptionMode.RECOMPUTE
    assert preemption_mode(mistral, 1024, host_free_tokens=512) is PreemptionMode.RECOMPUTE


def _multi_model_workload(n: int = 240) -> list[RequestSpec]:
    specs = [RequestSpec(i * 0.15, 150 + (i * 37) % 600, 60 + (i * 53) % 300)
             for i in range(n)]
    specs = assign_models(specs, {"mistral-7b": 0.4, "llama-3.1-8b": 0.3,
                                  "vicuna-13b": 0.3}, seed=1)
    return assign_deadlines(specs, 0.25, seed=1)


def _attainment(run: Any) -> float:
    ok = sum(1 for r in run.report.finished
             if r.timeline.finish_time - r.arrival_time <= r.slo.deadline)
    return ok / len(run.requests)


def test_qlm_serves_a_multi_model_cluster_better_than_round_robin() -> None:
    base = dataclasses.replace(ClusterSpec(model="mistral-7b", num_instances=2,
                                           models=MODELS), policy="edf")
    workload = _multi_model_workload()
    rr = simulate(with_router(base, "round-robin"), workload)
    qlm = simulate(with_router(base, "qlm"), workload)
    for run in (rr, qlm):  # every request served exactly once, none left behind
        ids = [r.request_id for r in run.report.finished]
        assert len(ids) == len(set(ids)) == len(workload) and not run.report.unfinished
        assert all(r.num_output_tokens == r.sampling.max_tokens for r in run.report.finished)
    assert len(qlm.report.model_swaps) < len(rr.report.model_swaps) / 2
    assert _attainment(qlm) > _attainment(rr)
    assert qlm.report.end_time < rr.report.end_time


def _overload_run(latency_share: float) -> tuple[QLMRouter, Any]:
    """80 requests at once on one instance: a `latency_share` of them with 1 s deadlines
    (hopeless behind 400-token prompts), the rest with 10 s (each group would meet it
    alone at the head, not behind the others)."""
    spec = with_router(ClusterSpec(model="mistral-7b", num_instances=1,
                                   models=("mistral-7b", "llama-3.1-8b")), "qlm")
    spec = dataclasses.replace(spec, router_options={"replan_interval": 0.0})
    workload = [RequestSpec(0.0, 400, 400, model=MODELS[i % 2]) for i in range(80)]
    workload = assign_deadlines(workload, latency_share, latency_deadline=1.0,
                                batch_deadline=10.0)
    router = make_router(spec.router, spec.router_options)
    assert isinstance(router, QLMRouter)
    run = simulate(spec, workload, router=router)
    assert len(run.report.finished) == 80
    return router, run


def test_the_planner_decides_under_overload_and_says_capacity_is_needed(
        caplog: pytest.LogCaptureFixture) -> None:
    """Hopeless groups no longer make the program infeasible: every invocation (a
    savable group late) makes a plan, which says more capacity is needed for the
    hopeless ones; nothing falls back to EDF."""
    with caplog.at_level(logging.INFO, logger="andante.cluster.qlm.router"):
        router, run = _overload_run(0.5)
    counters = router.counters
    assert counters.num_invocations >= 1 and counters.num_fallbacks == 0
    assert counters.num_plans == counters.num_invocations
    assert counters.num_needs_capacity >= 1
    assert "more capacity is needed" in caplog.text
    summary = run.report.router_counters
    assert summary["num_needs_capacity"] == counters.num_needs_capacity
    assert summary["planner_invocations"] == counters.num_invocations


def test_only_hopeless_groups_late_do_not_invoke_the_planner() -> None:
    """Every group misses its 1 s deadline even alone at the head: no order saves one."""
    router, _ = _overload_run(1.0)
    assert router.counters.num_invocations == 0


def test_the_planner_budget_is_work_not_wall_clock_by_default() -> None:
    default = QLMRouter().options
    assert default.time_limit_s is None and default.work_limit >= 1
    tuned = QLMRouter(work_limit=3, max_nodes=7, time_limit_ms=250.0).options
    assert (tuned.work_limit, tuned.max_nodes, tuned.time_limit_s) == (3, 7, 0.25)


def _fake_perf_counter(step: float) -> Any:
    """A wall clock that advances `step` seconds at every read (a slow or fast machine)."""
    reads = [0]

    def perf_counter() -> float:
        reads[0] += 1
        return reads[0] * step

    return perf_counter


def test_a_simulated_run_is_the_same_whatever_the_wall_clock_solve_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner's rate limit is cluster time, never the solve's wall time: a machine
    that solves in a microsecond and one that takes two seconds decide alike."""
    import time

    base = dataclasses.replace(ClusterSpec(model="mistral-7b", num_instances=2,
                                           models=MODELS), policy="edf")
    spec = with_router(base, "qlm")
    workload = [RequestSpec(i * 0.05, 150 + (i * 37) % 600, 60 + (i * 53) % 300)
                for i in range(80)]
    workload = assign_models(workload, {"mistral-7b": 0.4, "llama-3.1-8b": 0.3,
                                        "vicuna-13b": 0.3}, seed=1)
    workload = assign_deadlines(workload, 0.5, seed=1, latency_deadline=5.0)
    outcomes = []
    for step in (1e-6, 2.0):
        monkeypatch.setattr(time, "perf_counter", _fake_perf_counter(step))
        run = simulate(spec, workload)
        monkeypatch.undo()
        finished = sorted((r.request_id, r.timeline.finish_time, r.num_output_tokens)
                          for r in run.report.finished)
        outcomes.append((finished, run.report.router_counters))
    assert outcomes[0][1]["planner_invocations"] >= 2  # the rate limit is exercised
    assert outcomes[0] == outcomes[1]
