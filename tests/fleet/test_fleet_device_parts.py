"""A shared device's swap logic (andante.runtime.upstream.device) over stand-in upstreams."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from andante.cluster.instance import MultiModel
from andante.core.request import Request, SyntheticTokens
from andante.core.sampling import SamplingParams
from andante.runtime.upstream.device import FAILED_SWAP_BACKOFF_S, SharedDevice
from andante.runtime.upstream.discovery import UpstreamSpec
from andante.runtime.upstream.members import linked_models


class StandIn:
    def __init__(self, url: str, model: str, device: str = "gpu0") -> None:
        self.url, self.models, self.role, self.alive = url, (model,), "", True
        self.info = SimpleNamespace(spec=UpstreamSpec(url, device=device), sleeping=False)
        self.num_in_flight = 0
        self.got: list[str] = []

    def submit(self, req: Request) -> None:
        self.got.append(req.request_id)

    def abort(self, request_id: str) -> None:
        pass

    def withdraw(self, request_ids: Any) -> None:
        pass


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
