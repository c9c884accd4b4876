from __future__ import annotations

import pytest

from andante.cluster import Controller, make_router, router_names
from andante.cluster.load import LoadReport
from andante.cluster.router import LeastLoadedRouter, PowerOfTwoRouter, RoundRobinRouter
from tests.cluster.fakes import FakeInstance, load_report, request


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
    slots = _slots(load_report(num_running=4, drain_time=3.0),
                   load_report(num_running=1, drain_time=1.0),
                   load_report(num_running=2, drain_time=2.0))
    router = LeastLoadedRouter()
    assert router.route(request("a"), slots) == 1
    slots[1].num_sent = 3  # three sent, none reported yet: 1 s + 3 x 1 s per request
    assert router.route(request("b"), slots) == 2


def test_power_of_two_is_seeded_and_picks_the_less_loaded_of_its_pair() -> None:
    reports = [load_report(num_running=1, drain_time=float(i)) for i in range(6)]

    def picks(seed: int, n: int = 200) -> list[int | None]:
        router, slots = PowerOfTwoRouter(seed=seed), _slots(*reports)
        return [router.route(request(str(i)), slots) for i in range(n)]

    assert picks(3) == picks(3)  # the same seed: the same 200 decisions
    assert picks(3) != picks(4)
    chosen = picks(1)
    assert 5 not in chosen  # the most loaded instance never wins a pair
    assert set(chosen) == {0, 1, 2, 3, 4}
    # with two instances drawn from six, the least loaded wins every pair it is in
    # (probability 1/3), the second one every pair without the first (4/15), ...
    assert chosen.count(0) > chosen.count(2) > chosen.count(4)
