"""The fleet's pure parts: metrics parsing, SLO forwarding, the fleet file."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from andante.core.sampling import SLO
from andante.runtime.upstream.call import Call, Chunk, Full, slo_from
from andante.runtime.upstream.discovery import (
    FleetError,
    UpstreamInfo,
    UpstreamSpec,
    parse_fleet_file,
)
from andante.runtime.upstream.fleet import MAX_REPLACES, Fleet, FleetOptions
from andante.runtime.upstream.http1 import Head
from andante.runtime.upstream.metrics import parse_load

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="0",model_name="b"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.5
vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.75
vllm:num_requests_running_total_not_this 99
"""


def test_vllm_metrics_are_summed_over_models() -> None:
    load = parse_load(VLLM_METRICS)
    assert (load.num_running, load.num_waiting, load.kv_usage) == (5, 4, 0.75)


def test_older_vllm_and_andante_names() -> None:
    assert parse_load("vllm:gpu_cache_usage_perc 0.3\n").kv_usage == 0.3
    load = parse_load('andante:num_requests_running{model_name="toy"} 7\n')
    assert load.num_running == 7 and load.num_waiting is None and load.kv_usage is None


def test_garbage_metrics_give_no_figures() -> None:
    load = parse_load("not prometheus at all\n{}\nvllm:num_requests_waiting nan-ish\n")
    assert load.num_running is None and load.num_waiting is None


def _call(body: dict[str, object], slo: SLO) -> Call:
    async def make() -> Call:  # the event queue wants a loop
        return Call("r", "m", "/v1/completions", body, slo, False, 0.0, 10.0)
    return asyncio.run(make())


def test_slo_reaches_vllm_as_flat_xargs_and_andante_as_its_object() -> None:
    call = _call({"prompt": "x", "vllm_xargs": {"other": 1, "ttft": 9}},
                 SLO(ttft=0.5, deadline=10.0))
    vllm = call.body_for("vllm")
    assert vllm["vllm_xargs"] == {"other": 1, "ttft": 0.5, "deadline": 10.0}
    assert "slo" not in vllm
    andante = call.body_for("andante")
    assert andante["slo"] == {"ttft": 0.5, "deadline": 10.0} and "vllm_xargs" not in andante
    other = call.body_for("openai")
    assert "slo" not in other and "vllm_xargs" not in other


def test_slo_from_vllm_xargs_and_bad_values() -> None:
    assert slo_from({"vllm_xargs": {"tbt": 0.1, "tds": 5}}, None) == SLO(tbt=0.1, tds=5.0)
    assert slo_from({}, SLO(ttft=1.0)) == SLO(ttft=1.0)
    with pytest.raises(ValueError, match="vllm_xargs.ttft"):
        slo_from({"vllm_xargs": {"ttft": "soon"}}, None)
    with pytest.raises(ValueError, match="positive"):
        slo_from({"vllm_xargs": {"deadline": -1}}, None)


def test_fleet_file_is_the_cluster_format_with_urls() -> None:
    fleet = parse_fleet_file("""
router = "ascendra"
[router_options]
capacity = 64
[[instances]]
url = "http://a:8000/v1/"
hardware = "a100-80g"
role = "lp"
[[instances]]
url = "http://b:8000"
role = "hp"
max_num_seqs = 32
""")
    assert fleet.router == "ascendra" and fleet.router_options == {"capacity": 64}
    assert [(u.url, u.role, u.max_num_seqs) for u in fleet.upstreams] == [
        ("http://a:8000", "lp", 64), ("http://b:8000", "hp", 32)]


@pytest.mark.parametrize("text, message", [
    ("[[instances]]\nrole = 'lp'\n", "needs a url"),
    ("[[instances]]\nurl = 'ftp://x'\n", "http://"),
    ("[[instances]]\nurl = 'http://x'\ncount = 2\n", "count"),
    ("[[instances]]\nurl = 'http://x'\ncolour = 1\n", "unknown key"),
    ("router = 'rr'\n", "needs \\[\\[instances\\]\\]"),
    ("[[instances]\n", "not valid TOML"),
])
def test_bad_fleet_files(text: str, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        parse_fleet_file(text)


def _upstream() -> Any:
    from andante.core.clock import ManualClock
    from andante.runtime.upstream.discovery import UpstreamInfo, UpstreamSpec
    from andante.runtime.upstream.instance import UpstreamInstance

    async def forward(*_: Any) -> None:
        return None

    info = UpstreamInfo(UpstreamSpec("http://u:1", max_num_seqs=8), ("m",), "vllm")
    return UpstreamInstance(0, info, ManualClock(), forward, lambda *_: None)


def test_load_is_the_larger_of_the_poll_and_our_own_requests() -> None:
    from andante.runtime.upstream.metrics import UpstreamLoad

    up = _upstream()
    up.observe_poll(UpstreamLoad(num_running=5, num_waiting=2, kv_usage=0.5))
    stats = up.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (5, 2, 0.5)
    up.tasks = {f"r{i}": None for i in range(10)}  # ten of ours, three started
    up.started = {"r0", "r1", "r2"}
    stats = up.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_prefilling) == (5, 5, 7)
    up.tasks, up.started = {}, set()
    up.num_finished_since_poll = 4  # ours that ended since the poll counted them
    stats = up.stats()
    assert (stats.num_running, stats.num_waiting) == (1, 2)
    load = up.load()
    assert load.drain_time == up.service_s * (1 + 3 / 8)


def test_a_cancelled_attempts_late_bytes_never_reach_the_client() -> None:
    """A down upstream's request without a token is placed again: bytes its cancelled
    attempt's connection still delivers (same loop iteration) are dropped."""
    async def main() -> None:
        info = UpstreamInfo(UpstreamSpec("http://u:1", max_num_seqs=8), ("m",), "vllm")
        fleet = Fleet([info], FleetOptions())
        call = Call("r", "m", "/v1/completions", {}, SLO(), True, 0.0, 10.0)
        attempt = asyncio.get_running_loop().create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        fleet._relay(fleet.upstreams[0], call, b"data: 1\n\n", attempt)
        assert call.started and call.events.get_nowait() == Chunk(b"data: 1\n\n")
        call2 = Call("r2", "m", "/v1/completions", {}, SLO(), True, 0.0, 10.0)
        attempt.cancel()
        fleet._relay(fleet.upstreams[0], call2, b"data: late\n\n", attempt)
        assert not call2.started and call2.events.empty()

    asyncio.run(main())


def test_a_request_misplaced_again_and_again_goes_round_a_bounded_number_of_times() -> None:
    """A request placed where its model cannot be served, while the fleet believes
    another upstream serves it: placed again at most `MAX_REPLACES` times in a row,
    then held; each poll that releases it places it once more, not `MAX_REPLACES`
    times (the count is reset only when an upstream answers it)."""
    async def main() -> None:
        info = UpstreamInfo(UpstreamSpec("http://u:1", max_num_seqs=8), ("m",), "vllm")
        fleet = Fleet([info], FleetOptions())
        placed: list[str] = []

        def misplace(req: Any) -> None:
            placed.append(req.request_id)
            fleet._hold(req)

        fleet.groups["m"].controller.submit = misplace  # type: ignore[method-assign]
        fleet._servable = lambda model: True  # type: ignore[method-assign]
        fleet.submit(Call("r", "m", "/v1/completions", {}, SLO(), True, 0.0, 10.0), 4,
                     None, 0)
        assert len(placed) == 1 + MAX_REPLACES
        assert [req.request_id for req in fleet.held] == ["r"]
        for poll in range(1, 4):
            fleet._release_held(only_servable=True)
            assert len(placed) == 1 + MAX_REPLACES + poll
            assert [req.request_id for req in fleet.held] == ["r"]

    asyncio.run(main())


def test_an_upstreams_answer_resets_the_count_of_re_placements() -> None:
    """Once an upstream of its model answers a request, it was placed right: a later
    misplacement (a retry's) may place it again, `MAX_REPLACES` times."""
    class Answered:
        head = Head(200, "application/json", 2, False, True)

        async def read(self) -> bytes:
            return b"{}"

    class Pool:
        async def post(self, path: str, payload: bytes, relay: Any) -> Answered:
            return Answered()

    async def main() -> None:
        info = UpstreamInfo(UpstreamSpec("http://u:1", max_num_seqs=8), ("m",), "vllm")
        fleet = Fleet([info], FleetOptions())
        fleet._pools = [Pool()]  # type: ignore[list-item]
        call = Call("r", "m", "/v1/completions", {}, SLO(), False, 0.0, 10.0)
        call.num_replaced = MAX_REPLACES
        fleet.calls["r"] = call
        await fleet._forward(fleet.upstreams[0], SimpleNamespace(request_id="r"))  # type: ignore[arg-type]
        assert call.num_replaced == 0
        assert call.events.get_nowait() == Full(200, "application/json", b"{}")

    asyncio.run(main())
