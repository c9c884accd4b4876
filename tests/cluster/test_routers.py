from __future__ import annotations

import pytest

from andante.cluster import Controller, make_router, router_names
from andante.cluster.load import LoadReport
from andante.cluster.router import LeastLoadedRouter, PowerOfTwoRouter, RoundRobinRouter
from tests.cluster.fakes import FakeInstance, request


def _slots(*reports: LoadReport) -> list:  # the controller's slots are what routers see
    return Controller([FakeInstance(i, report=r) for i, r in enumerate(reports)],
                      RoundRobinRouter()).slots


def test_registry_names_and_errors() -> None:
    assert {"round-robin", "least-loaded", "power-of-two", "ascendra"} <= set(router_names())
    assert isinstance(make_router("least-loaded"), LeastLoadedRouter)
    with pytest.raises(ValueError, match="unknown router"):
        make_router("nope")
    with pytest.raises(ValueError, match="unknown option"):
        make_router("round-robin", {"bogus": 1})


def test_round_robin_takes_turns_and_skips_dead_instances() -> None:
    slots = _slots(LoadReport(), LoadReport(), LoadReport())
    router = RoundRobinRouter()
    assert [router.route(request(str(i)), slots) for i in range(4)] == [0, 1, 2, 0]
    slots[1].down = True
    assert [router.route(request(str(i)), slots) for i in range(3)] == [2, 0, 2]
    for slot in slots:
        slot.down = True
    assert router.route(request("x"), slots) is None


def test_least_loaded_uses_predicted_drain_time_and_requests_in_transit() -> None:
    slots = _slots(LoadReport(num_running=4, drain_time=3.0),
                   LoadReport(num_running=1, drain_time=1.0),
                   LoadReport(num_running=2, drain_time=2.0))
    router = LeastLoadedRouter()
    assert router.route(request("a"), slots) == 1
    slots[1].num_sent = 3  # three sent, none reported yet: 1 s + 3 x 1 s per request
    assert router.route(request("b"), slots) == 2


def test_power_of_two_is_seeded_and_picks_the_less_loaded_of_its_pair() -> None:
    reports = [LoadReport(num_running=1, drain_time=float(i)) for i in range(6)]
    a = [PowerOfTwoRouter(seed=3).route(request(str(i)), _slots(*reports)) for i in range(1)]
    b = [PowerOfTwoRouter(seed=3).route(request(str(i)), _slots(*reports)) for i in range(1)]
    assert a == b
    router = PowerOfTwoRouter(seed=1)
    picks = [router.route(request(str(i)), _slots(*reports)) for i in range(200)]
    assert 5 not in picks  # the most loaded instance never wins a pair
    assert len(set(picks)) >= 3
