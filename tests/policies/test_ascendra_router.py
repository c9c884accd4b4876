"""Ascendra's router: LP round robin, the HP ticket (§6.1), offloads to HP."""

from __future__ import annotations

from andante.cluster import Controller, make_router
from andante.cluster.ascendra import AscendraRouter
from andante.cluster.load import LoadReport
from tests.cluster.fakes import FakeInstance, load_report, request


def _cluster(hp_load: LoadReport) -> tuple[Controller, list[FakeInstance]]:
    insts = [FakeInstance(0, "lp"), FakeInstance(1, "lp"), FakeInstance(2, "hp", hp_load)]
    return Controller(insts, make_router("ascendra")), insts


def test_ticket_conditions() -> None:
    router = AscendraRouter(capacity=128)
    idle = load_report(num_running=10, kv_usage=0.5, max_num_seqs=512)
    ctl, _ = _cluster(idle)
    hp = ctl.slots[2]
    assert router.has_ticket(hp)
    for busy in (dict(num_prefilling=1), dict(num_running=64), dict(kv_usage=0.95)):
        ctl.slots[2].instance.set_load(**busy)  # type: ignore[attr-defined]
        assert not router.has_ticket(hp), busy
        ctl.slots[2].instance.report = idle  # type: ignore[attr-defined]
    assert not router.has_ticket(ctl.slots[0])  # LP instances hold no ticket


def test_one_outstanding_ticket_then_lp_round_robin() -> None:
    ctl, insts = _cluster(load_report(num_running=3))
    for i in range(4):
        ctl.submit(request(f"r{i}"))
    # the first goes to the idle HP; it is then in transit (not yet reported), so the
    # HP holds no ticket and the rest go to the LP pool in turn
    assert [r.request_id for r in insts[2].submitted] == ["r0"]
    assert [r.request_id for r in insts[0].submitted] == ["r1", "r3"]
    assert [r.request_id for r in insts[1].submitted] == ["r2"]
    insts[2].set_load(num_received=1, num_prefilling=1)  # reported: prefilling
    ctl.submit(request("r4"))
    assert insts[1].submitted[-1].request_id == "r4"
    insts[2].set_load(num_prefilling=0)  # idle again: a new ticket
    ctl.submit(request("r5"))
    assert insts[2].submitted[-1].request_id == "r5"
    assert ctl.router.num_ticketed == 2  # type: ignore[attr-defined]


def test_offloads_go_to_the_shortest_hp_queue() -> None:
    insts = [FakeInstance(0, "lp"), FakeInstance(1, "hp", load_report(num_waiting=5)),
             FakeInstance(2, "hp", load_report(num_waiting=1))]
    ctl = Controller(insts, AscendraRouter(tickets=False))
    ctl.submit(request("a"))
    ctl.on_step(0, handoffs=[insts[0].submitted[0]])
    assert ctl.owner_of("a") == 2
    lonely = [FakeInstance(0, "lp"), FakeInstance(1, "lp")]  # no HP: it stays put
    ctl = Controller(lonely, AscendraRouter())
    ctl.submit(request("b"))
    ctl.on_step(0, handoffs=[lonely[0].submitted[0]])
    assert ctl.owner_of("b") == 0
