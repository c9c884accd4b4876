"""When a QLM agent swaps a model early, and what it pulls while an instance drains."""

from __future__ import annotations

from collections.abc import Mapping

from andante.cluster.instance import ModelState
from andante.cluster.qlm import RCTEstimator, VirtualQueue, form_groups
from andante.cluster.qlm.agents import AgentInstance
from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.router import QLMRouter
from tests.cluster.fakes import load_report
from tests.cluster.qlm.helpers import FakeModels, FakeSlot, FlatCost, model_state, request, view

GB = 10**9


def _state(device: str = "m1", loading_s: float = 0.0) -> ModelState:
    # 1 GB of weights over a 1 GB/s host link: a warm load takes 1 s
    return model_state({"m1": GB, "m2": GB}, device, ("m1", "m2"), loading_s)


def _slot(drain_s: float, running: int = 4, waiting: int = 0, uncomputed: int = 0) -> FakeSlot:
    load = load_report(drain_time=drain_s, num_running=running, num_waiting=waiting,
                       max_num_seqs=16, time=100.0, num_uncomputed_tokens=uncomputed)
    return FakeSlot(load, FakeModels(_state()))


def _instance(drain_s: float, running: int = 4, waiting: int = 0, state: ModelState | None = None,
              deadlines: Mapping[str, float] | None = None, uncomputed: int = 0
              ) -> AgentInstance:
    """Instance 0 as its agent sees it; its drain time is the load report's."""
    return AgentInstance(_slot(drain_s, running, waiting, uncomputed), state or _state(),
                         view("0", on_device=("m1",)), drain_s, deadlines or {})


def _head(deadline_in: float, now: float = 100.0) -> RequestGroup:
    return form_groups([request("b", model="m2", arrival=0.0, slo=now + deadline_in)], 8)[0]


def test_a_late_head_group_swaps_in_before_the_drain() -> None:
    router = QLMRouter()
    late = _head(-5.0)  # already past its deadline
    assert router.agents.should_swap(_instance(drain_s=10.0), late, 100.0)


def test_no_early_swap_when_the_head_can_wait_or_the_drain_is_shorter_than_the_load() -> None:
    router = QLMRouter()
    assert not router.agents.should_swap(_instance(drain_s=10.0), _head(50.0), 100.0)
    assert not router.agents.should_swap(_instance(drain_s=0.5), _head(-5.0), 100.0)
    assert not router.agents.should_swap(_instance(drain_s=10.0, state=_state(loading_s=0.3)),
                                         _head(-5.0), 100.0)  # still loading
    assert router.agents.should_swap(_instance(drain_s=10.0, running=0), _head(50.0), 100.0)


def test_no_early_swap_that_would_flush_more_urgent_requests() -> None:
    router = QLMRouter()
    placed = {"running": 90.0}  # placed there, due before the head (95)
    assert not router.agents.should_swap(_instance(drain_s=10.0, deadlines=placed),
                                         _head(-5.0), 100.0)
    placed = {"running": 120.0}
    assert router.agents.should_swap(_instance(drain_s=10.0, deadlines=placed),
                                     _head(-5.0), 100.0)


def test_hysteresis_keeps_a_swapped_in_model_long_enough() -> None:
    router = QLMRouter(swap_hysteresis=2.0)
    router.agents.last_swap[0] = (99.0, 1.0)  # swapped 1 s ago, a 1 s load
    assert not router.agents.should_swap(_instance(drain_s=10.0), _head(-5.0), 100.0)
    router.agents.last_swap[0] = (97.5, 1.0)  # 2.5 s ago: served twice its load time
    assert router.agents.should_swap(_instance(drain_s=10.0), _head(-5.0), 100.0)


def test_while_draining_it_pulls_only_device_model_work_that_ends_within_the_drain() -> None:
    router = QLMRouter()
    for _ in range(50):  # the "long" class of m1 produces 2000 tokens
        router.outputs.observe(form_groups([request("l0", slo_class="long")], 8)[0].key, 2000)
    groups = [_head(-5.0),
              form_groups([request("s1", model="m1", slo_class="short"),
                           request("s2", model="m1", slo_class="short")], 8)[0],
              form_groups([request("l1", model="m1", slo_class="long")], 8)[0]]
    vq = VirtualQueue("0", tuple(g.group_id for g in groups))
    by_id = {g.group_id: g for g in groups}
    estimator = RCTEstimator(FlatCost(prefill_s=0.1, step_s=0.01), router.outputs,
                             {"m1": GB, "m2": GB})
    agents = router.agents
    # short: 0.1 s + 256 expected tokens x 0.01 s = 2.7 s <= 5 s; long: 20 s > 5 s
    assert agents.fill_drain(_instance(drain_s=5.0), vq, by_id, estimator) == ("s1", "s2")
    assert agents.fill_drain(_instance(drain_s=1.0), vq, by_id, estimator) == ()
    # the instance holds a step's worth of prompt tokens not yet prefilled (running
    # decodes' next tokens aside): it cannot start more at its next step
    backlog = _instance(drain_s=5.0, waiting=2, uncomputed=4 + 8192)
    assert agents.fill_drain(backlog, vq, by_id, estimator) == ()
    no_pull = QLMRouter(pull=False).agents
    assert no_pull.fill_drain(_instance(drain_s=5.0), vq, by_id, estimator) == ()
