"""A shared device's swap logic (andante.runtime.upstream.device) over stand-in upstreams."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from andante.cluster.instance import MultiModel
from andante.core.request import Request, SyntheticTokens
from andante.core.sampling import SLO, SamplingParams
from andante.runtime.upstream.device import (
    FAILED_SWAP_BACKOFF_S,
    MAX_DRAIN_S,
    SharedDevice,
    cut_pays,
)
from andante.runtime.upstream.discovery import UpstreamSpec
from andante.runtime.upstream.members import linked_models


class StandIn:
    def __init__(self, url: str, model: str, device: str = "gpu0") -> None:
        self.url, self.models, self.role, self.alive = url, (model,), "", True
        self.info = SimpleNamespace(spec=UpstreamSpec(url, device=device), sleeping=False)
        self.num_in_flight = 0
        self.got: list[str] = []
        self.requests: dict[str, Request] = {}  # in flight, by id
        self.started: set[str] = set()  # of those, the ones with a byte streamed
        self.withdrawn: list[str] = []

    def submit(self, req: Request) -> None:
        self.got.append(req.request_id)

    def abort(self, request_id: str) -> None:
        pass

    def withdraw(self, request_ids: Any) -> None:
        self.withdrawn += request_ids
        for rid in request_ids:
            del self.requests[rid]
            self.num_in_flight -= 1


def _req(rid: str, model: str) -> Request:
    return Request(rid, SyntheticTokens(4), SamplingParams(max_tokens=4), 0.0, model=model)


def _device(post_status: int = 200, failing: str = ""
            ) -> tuple[SharedDevice, list[StandIn], list[str], list[Any]]:
    """`post_status` answers every call, or only the call `failing` (URL + path)."""
    ups = [StandIn("http://a", "alpha"), StandIn("http://b", "beta")]
    calls: list[str] = []
    back: list[Any] = []

    async def post(url: str, path: str) -> int:
        calls.append(url + path)
        return post_status if not failing or url + path == failing else 200

    device = SharedDevice(0, "gpu0", ups, 0, post, lambda d: calls.append("swapped"),  # type: ignore[arg-type]
                          lambda d, reqs: back.extend(reqs))
    return device, ups, calls, back


def test_swap_parks_then_sends_to_the_woken_server() -> None:
    async def main() -> None:
        device, (a, b), calls, back = _device()
        assert isinstance(device, MultiModel)
        assert device.model_state().device == "alpha" and device.model_state().host == ("beta",)
        device.submit(_req("r1", "alpha"))
        device.submit(_req("r2", "beta"))  # not awake: parked
        assert a.got == ["r1"] and [r.request_id for r in device.parked] == ["r2"]
        a.num_in_flight = 1
        device.swap_model("beta")
        await asyncio.sleep(0.01)
        assert device.model_state().device == "beta" and device.model_state().loading_s > 0
        device.submit(_req("r3", "beta"))  # during the swap: parked
        await asyncio.sleep(0.05)
        assert calls == []  # alpha's request still runs
        a.num_in_flight = 0
        await asyncio.sleep(0.05)
        assert calls == ["http://a/sleep?level=1", "http://b/wake_up", "swapped"]
        assert device.model == "beta" and b.got == ["r2", "r3"] and not back
        assert device.num_swaps == 1 and device.model_state().loading_s == 0.0

    asyncio.run(main())


def test_a_failed_swap_hands_the_parked_back() -> None:
    async def main() -> None:
        device, (a, b), calls, back = _device(post_status=500)
        device.submit(_req("r1", "beta"))
        device.swap_model("beta")
        await asyncio.sleep(0.05)
        assert device.model == "alpha" and device.target is None
        assert not back  # handed back after a back-off, from outside the driver
        await asyncio.sleep(FAILED_SWAP_BACKOFF_S + 0.2)
        assert [r.request_id for r in back] == ["r1"] and not b.got

    asyncio.run(main())


def test_a_server_that_does_not_wake_puts_the_outgoing_one_back_to_work() -> None:
    async def main() -> None:
        device, (a, b), calls, back = _device(post_status=500, failing="http://b/wake_up")
        device.submit(_req("r1", "beta"))
        device.swap_model("beta")
        await asyncio.sleep(0.05)
        assert calls == ["http://a/sleep?level=1", "http://b/wake_up", "http://a/wake_up"]
        assert device.model == "alpha" and device.awake is a
        device.submit(_req("r2", "alpha"))
        assert a.got == ["r2"]

    asyncio.run(main())


def test_linked_models() -> None:
    ups = [StandIn("http://a", "alpha", "gpu0"), StandIn("http://b", "beta", "gpu0"),
           StandIn("http://c", "beta", "gpu1"), StandIn("http://d", "gamma", "gpu1"),
           StandIn("http://e", "delta", "")]
    assert sorted(map(sorted, linked_models(ups))) == [  # type: ignore[arg-type]
        ["alpha", "beta", "gamma"], ["delta"]]


def test_a_server_down_gives_back_the_parked_and_stops_the_switch() -> None:
    async def main() -> None:
        device, (a, b), calls, back = _device()
        device.submit(_req("r1", "alpha"))
        a.num_in_flight = 1  # alpha's request runs: the switch drains it first
        device.submit(_req("r2", "beta"))
        device.swap_model("beta")
        await asyncio.sleep(0.02)
        assert [r.request_id for r in device.parked] == ["r2"] and device.alive
        b.alive = False  # the sleeping server stops answering
        assert [r.request_id for r in device.server_down(b)] == ["r2"] and not device.parked
        await asyncio.sleep(0.05)
        assert calls == [] and device.awake is a and device.target is None  # a never slept
        await asyncio.sleep(FAILED_SWAP_BACKOFF_S + 0.1)
        assert not back  # nothing handed back twice

    asyncio.run(main())


def test_a_sleeping_server_down_takes_out_only_its_model() -> None:
    async def main() -> None:
        held: list[Request] = []
        device, (a, b), calls, back = _device()
        device._hold = held.append
        b.alive = False
        device.server_down(b)
        # the awake model is routed on; the down one is nowhere on the device
        assert device.alive
        state = device.model_state()
        assert state.device == "alpha" and state.host == () and set(state.costs) == {"alpha"}
        device.submit(_req("r1", "alpha"))
        assert a.got == ["r1"]
        device.swap_model("beta")  # no swap to a server that is down
        device.submit(_req("r2", "beta"))  # placed here all the same: held, never parked
        await asyncio.sleep(0.05)
        assert calls == [] and not device.parked and [r.request_id for r in held] == ["r2"]
        assert device.switcher.pending is None and not b.got
        # back: put to sleep (it may have restarted awake), then its model returns
        b.alive = True
        assert await device.server_back(b)  # type: ignore[arg-type]
        assert calls == ["http://b/sleep?level=1"]
        assert device.model_state().host == ("beta",)
        assert await device.server_back(a)  # type: ignore[arg-type]
        assert calls[-1] == "http://a/wake_up"  # the awake one is woken (a no-op if awake)

    asyncio.run(main())


def test_the_awake_server_down_takes_the_device_out() -> None:
    device, (a, b), calls, back = _device()
    a.alive = False
    assert not device.alive
    a.alive = True
    assert device.alive


def test_a_server_back_that_will_not_sleep_stays_out() -> None:
    async def main() -> None:
        device, (a, b), calls, back = _device(post_status=500, failing="http://b/sleep?level=1")
        assert not await device.server_back(b)  # type: ignore[arg-type]

    asyncio.run(main())


# ---- the drain before a swap: wait for the streams, or cut them (device.cut_pays) ----

def _due(rid: str, model: str, arrival: float, deadline: float | None) -> Request:
    return Request(rid, SyntheticTokens(4), SamplingParams(max_tokens=4), arrival,
                   model=model, slo=SLO(deadline=deadline))


def test_cut_pays_only_to_save_more_parked_requests_than_it_cuts() -> None:
    swap = 1.0
    soon = [_due(f"p{i}", "beta", 0.0, 5.0) for i in range(3)]  # latest start: 4.0
    assert not cut_pays([], 1, 4.0, swap)
    assert not cut_pays([_due("n", "beta", 0.0, None)] * 5, 1, 100.0, swap)  # no deadline
    assert not cut_pays(soon, 1, 3.0, swap)  # they can still wait
    assert cut_pays(soon, 2, 4.0, swap)  # 3 saved > 2 cut
    assert not cut_pays(soon, 3, 4.0, swap)  # 3 saved, 3 cut: waiting loses no more
    assert not cut_pays(soon, 1, 4.5, swap)  # late whatever happens: cutting saves none
    mixed = soon + [_due("far", "beta", 0.0, 60.0)]  # can wait, but a swap now saves it too
    assert cut_pays(mixed, 3, 4.0, swap)


class _Clock:
    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time


def _draining_device() -> tuple[SharedDevice, StandIn, list[str], list[Any], _Clock]:
    """Alpha awake with a stream under way (s1) and a request without a byte (u1)."""
    device, (a, b), calls, back = _device()
    clock = _Clock()
    cut: list[str] = []

    def cut_streams(upstream: Any, rids: list[str], model: str) -> None:
        cut.extend(rids)
        for rid in rids:
            del upstream.requests[rid]
            upstream.started.discard(rid)
            upstream.num_in_flight -= 1

    device._cut, device._clock = cut_streams, clock
    for rid in ("s1", "u1"):
        device.submit(_req(rid, "alpha"))
        a.requests[rid] = _req(rid, "alpha")
    a.started.add("s1")
    a.num_in_flight = 2
    return device, a, calls, cut, clock


def test_a_swap_evicts_the_unstarted_at_once_and_waits_for_the_streams() -> None:
    async def main() -> None:
        device, a, calls, cut, clock = _draining_device()
        device.submit(_due("p1", "beta", 0.0, 30.0))  # parked; can wait for the stream
        device.swap_model("beta")
        await asyncio.sleep(0.05)
        assert a.withdrawn == ["u1"] and device.num_evicted == 1  # placed again elsewhere
        assert not cut and calls == []  # the stream runs on
        a.requests.clear(), a.started.clear()
        a.num_in_flight = 0  # it ended
        await asyncio.sleep(0.05)
        assert not cut and calls[:2] == ["http://a/sleep?level=1", "http://b/wake_up"]
        assert device.model == "beta"

    asyncio.run(main())


def test_a_swap_cuts_the_streams_when_that_saves_more_parked_deadlines() -> None:
    async def main() -> None:
        device, a, calls, cut, clock = _draining_device()
        for i in range(2):
            device.submit(_due(f"p{i}", "beta", 0.0, 3.0))
        device.swap_model("beta")
        await asyncio.sleep(0.05)
        assert not cut  # their latest start (3 s less the 1 s swap) has not come
        clock.time = 2.0
        await asyncio.sleep(0.05)
        assert cut == ["s1"] and device.num_cut == 1  # 2 parked saved > 1 stream cut
        assert device.model == "beta" and calls[:2] == ["http://a/sleep?level=1",
                                                        "http://b/wake_up"]

    asyncio.run(main())


def test_a_swap_waits_when_cutting_would_lose_as_many_as_it_saves() -> None:
    async def main() -> None:
        device, a, calls, cut, clock = _draining_device()
        device.submit(_due("p1", "beta", 0.0, 3.0))
        device.swap_model("beta")
        await asyncio.sleep(0.02)  # the drain started at 0 s
        clock.time = 2.0
        await asyncio.sleep(0.05)
        assert not cut and calls == []  # 1 saved, 1 cut: the stream goes on
        clock.time = MAX_DRAIN_S + 0.1  # the bound: cut whatever the count
        await asyncio.sleep(0.05)
        assert cut == ["s1"] and device.model == "beta"

    asyncio.run(main())


def test_a_member_defers_a_request_for_another_model_as_a_device_does() -> None:
    """Placed on a `Member` of another model (refused: its model's servers are down),
    the request goes to `hold` on the next loop turn, as a device's does, never inside
    the controller's placement, and never to the upstream."""
    from andante.runtime.upstream.members import Member

    async def main() -> None:
        up = StandIn("http://a", "alpha", device="")
        up.num_received, up.capabilities = 0, frozenset()  # type: ignore[attr-defined]
        held: list[Request] = []
        member = Member(0, up, "alpha", held.append)  # type: ignore[arg-type]
        member.submit(_req("r1", "beta"))
        assert held == [] and up.num_received == 1  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        assert [r.request_id for r in held] == ["r1"] and up.got == []
        member.submit(_req("r2", "alpha"))
        assert up.got == ["r2"]

    asyncio.run(main())
