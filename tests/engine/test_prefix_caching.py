"""The scheduler with prefix caching: admissions start at the cached prefix, counters
and timelines record queries and hits, every policy sees the same figures."""

from __future__ import annotations

import pytest

from andante.core import Request, SamplingParams
from andante.engine import Engine
from tests.engine.helpers import make_engine
from tests.exec.policies import POLICY as FORCED

B = 4
PREFIX = list(range(1, 41))  # 10 full blocks


def _request(rid: str, suffix: list[int], max_tokens: int = 3) -> Request:
    return Request(rid, PREFIX + suffix, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   0.0)


def _run(engine: Engine) -> None:
    while engine.has_work:
        engine.step()


def _first_cached(executor, rid: str) -> int:  # type: ignore[no-untyped-def]
    for batch in executor.batches:
        for req, cached in zip(batch.requests, batch.num_cached_tokens, strict=True):
            if req.request_id == rid:
                return cached
    raise AssertionError(f"{rid} never ran")


@pytest.mark.parametrize("policy", ["vllm", "vllm-v0", "sarathi", "andes", "fastserve", "edf"])
def test_a_later_request_starts_at_the_cached_prefix(policy: str) -> None:
    engine, executor, _ = make_engine(policy, 64, 16, block_size=B)
    first = _request("a", [90, 91])
    engine.add_request(first)
    _run(engine)
    second = _request("b", [80, 81, 82])
    engine.add_request(second)
    _run(engine)
    assert _first_cached(executor, "b") == 40
    assert second.timeline.num_prefix_hit_tokens == 40
    assert second.timeline.num_prefix_query_tokens == 43
    stats = engine.stats()
    assert stats.prefix_cache_queries == 42 + 43 and stats.prefix_cache_hits == 40
    assert second.num_output_tokens == 3
    engine.scheduler.kv.check_invariants()


def test_the_whole_prompt_is_never_skipped() -> None:
    engine, executor, _ = make_engine("vllm", 64, block_size=B)
    engine.add_request(Request("a", PREFIX, SamplingParams(max_tokens=2, ignore_eos=True), 0.0))
    _run(engine)
    again = Request("b", PREFIX, SamplingParams(max_tokens=2, ignore_eos=True), 0.0)
    engine.add_request(again)
    _run(engine)
    assert _first_cached(executor, "b") == 36  # the last block is computed again
    assert again.num_output_tokens == 2


def test_requests_admitted_together_cannot_share_what_neither_computed() -> None:
    engine, executor, _ = make_engine("vllm", 64, block_size=B)
    engine.add_request(_request("a", [1]))
    engine.add_request(_request("b", [2]))
    _run(engine)
    assert _first_cached(executor, "a") == _first_cached(executor, "b") == 0
    assert engine.stats().prefix_cache_hits == 0


def test_switched_off_nothing_is_shared() -> None:
    engine, executor, _ = make_engine("vllm", 64, block_size=B, enable_prefix_caching=False)
    for rid in ("a", "b"):
        engine.add_request(_request(rid, [7]))
        _run(engine)
    assert _first_cached(executor, "b") == 0
    assert engine.stats().prefix_cache_queries == 0


def test_a_recomputed_request_finds_its_own_blocks_again() -> None:
    engine, executor, _ = make_engine(FORCED, 64, block_size=B,
                                      options={"victim": "a", "mode": "recompute", "at_step": 3})
    req = _request("a", [5, 6], max_tokens=6)
    engine.add_request(req)
    _run(engine)
    assert req.timeline.num_recomputes == 1
    assert req.timeline.num_prefix_hit_tokens >= 40  # the re-prefill skipped its prompt
    assert req.num_output_tokens == 6
    resumed = [c for b in executor.batches for r, c in zip(b.requests, b.num_cached_tokens,
                                                             strict=True) if r is req]
    assert resumed.count(0) == 1  # only the very first prefill started from nothing


def test_a_withdrawn_request_leaves_without_its_tentative_hit() -> None:
    engine, _, _ = make_engine("vllm", 64, block_size=B, max_num_seqs=1)
    engine.add_request(_request("a", [1], max_tokens=8))
    engine.step()  # a computes its prompt
    engine.step()
    engine.add_request(_request("b", [2]))
    engine.step()  # b waits (one sequence at a time), starting at its hit
    waiting = engine.scheduler.requests["b"]
    assert waiting.num_computed_tokens == 40
    withdrawn = engine.scheduler.withdraw("b")
    assert withdrawn is waiting and withdrawn.num_computed_tokens == 0
    assert engine.scheduler.totals.num_computed_tokens == engine.scheduler.requests[
        "a"].num_computed_tokens
    _run(engine)
    engine.scheduler.kv.check_invariants()
