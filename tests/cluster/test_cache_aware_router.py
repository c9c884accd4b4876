"""The cache-aware router (issue 30 item 1): a request goes where its prefix is cached
unless the cluster is imbalanced; the same code for every kind of instance."""

from __future__ import annotations

from pathlib import Path

import pytest

from andante.cluster import Controller, make_router
from andante.cluster.cache_aware import CacheAwareRouter, PrefixIndex, prompt_block_hashes
from andante.cluster.load import LoadReport
from andante.cluster.router import RoundRobinRouter
from andante.core import Request, SamplingParams
from andante.core.request import PrefixIds
from andante.sim import ClusterSpec, simulate
from andante.workload.prefix import with_trace_ids
from andante.workload.spec import RequestSpec
from andante.workload.traces import load_trace
from tests.benchmarks.scripts import BENCHMARKS, load_script
from tests.cluster.fakes import FakeInstance, request


def _slots(*reports: LoadReport) -> list:
    return Controller([FakeInstance(i, report=r) for i, r in enumerate(reports)],
                      RoundRobinRouter()).slots


def _shared(rid: str, first_id: int, prompt: int = 200) -> Request:
    req = request(rid, prompt)
    req.prefix_ids = PrefixIds((first_id, first_id + 1, first_id + 2), 64, 192)
    return req


def test_prefix_index_matches_leading_blocks_and_keeps_its_capacity() -> None:
    index = PrefixIndex()
    index.record([1, 2, 3], capacity=4)
    assert index.match([1, 2, 9]) == 2 and index.match([5, 1]) == 0  # (hashes are chained)
    index.record([7, 8], capacity=4)  # 1 is the least recently used: evicted
    assert len(index) == 4 and index.match([1, 2]) == 0


def test_a_request_goes_where_its_prefix_was_sent() -> None:
    slots = _slots(LoadReport(), LoadReport(), LoadReport())
    router = make_router("cache-aware")
    assert isinstance(router, CacheAwareRouter)
    first = router.route(_shared("a", 10), slots)
    slots[first].num_sent = 2  # busier than the others, but holds the prefix
    assert router.route(_shared("b", 10), slots) == first
    other = router.route(_shared("c", 50), slots)  # another prefix: by load
    assert other != first and router.num_cache_routed == 1


def test_imbalance_and_a_short_match_route_by_load() -> None:
    slots = _slots(LoadReport(), LoadReport())
    router = CacheAwareRouter(balance_abs=4, balance_rel=1.5)
    home = router.route(_shared("a", 10), slots)
    slots[home].num_sent = 10  # 10 vs 0 in flight: imbalanced
    assert router.route(_shared("b", 10), slots) == 1 - home
    slots[home].num_sent = 0
    half = request("c", 1000)  # its ids cover 192 of 1,000 tokens: under the threshold
    half.prefix_ids = PrefixIds((10, 11, 12), 64, 192)
    slots[1 - home].num_sent = 1
    assert router.route(half, slots) == home  # by load (the other has one in transit)
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwareRouter(cache_threshold=2.0)


def test_real_token_prompts_hash_as_the_block_manager_does() -> None:
    tokens = list(range(100))
    a = Request("a", tokens, SamplingParams(max_tokens=4), 0.0)
    b = Request("b", tokens[:64] + [7] * 36, SamplingParams(max_tokens=4), 0.0)
    ha, hb = prompt_block_hashes(a, 16), prompt_block_hashes(b, 16)
    assert len(ha) == 6 and ha[:4] == hb[:4] and ha[4] != hb[4]
    assert prompt_block_hashes(request("s", 100), 16) == []  # content of its own only


def test_cache_aware_beats_least_loaded_on_a_conversation_trace(tmp_path: Path) -> None:
    script = load_script(BENCHMARKS / "conversation_trace.py", register=True)
    turns = script.conversation_turns(150, 2.0, 4.0, 2, 1024, seed=1)
    specs = [RequestSpec(t.time, t.prompt, t.output) for t in turns]
    path = tmp_path / "conv.jsonl"
    script.write_trace(path, turns)
    workload = with_trace_ids(specs, load_trace(path))
    runs = {router: simulate(ClusterSpec(num_instances=4, router=router), workload).summary
            for router in ("least-loaded", "cache-aware")}
    cache, least = runs["cache-aware"], runs["least-loaded"]
    assert cache.num_finished == least.num_finished  # (a few exceed the 8,192-token context)
    assert cache.prefix_cache_hit_rate > least.prefix_cache_hit_rate + 0.1
    assert cache.ttft.mean < least.ttft.mean
