from __future__ import annotations

import pytest

from andante.core.sampling import SLO
from andante.policies import policy_names
from tests.engine.helpers import make_engine, make_request, run_to_completion


def test_sarathi_chunks_prefill_and_runs_decodes_first() -> None:
    engine, executor, clock = make_engine("sarathi", 64, options={"token_budget": 8})
    engine.add_request(make_request("a", 4, 6))
    engine.step()  # a prefilled in one chunk
    engine.add_request(make_request("b", 20, 2, arrival=0.01))
    out = engine.step()
    assert [r.request_id for r in out.batch.requests] == ["a", "b"]
    assert out.batch.num_new_tokens == [1, 7]  # decode first, then a chunk of the budget
    assert out.batch.samples == [True, False]
    run_to_completion(engine, clock)
    assert max(sum(b.num_new_tokens) for b in executor.batches) <= 8


def _batches(
    policy: str, options: dict[str, int] | None, budget: int
) -> list[tuple[list[str], list[int]]]:
    engine, executor, clock = make_engine(
        policy, 12, options=options, max_num_batched_tokens=budget, max_model_len=8
    )
    for i, prompt in enumerate((7, 5, 6, 3, 7)):
        engine.add_request(make_request(f"r{i}", prompt, 4, arrival=i * 1e-3))
    run_to_completion(engine, clock)
    return [([r.request_id for r in b.requests], b.num_new_tokens) for b in executor.batches]


def test_sarathi_is_the_vllm_loop_with_a_smaller_budget() -> None:
    sarathi = _batches("sarathi", {"token_budget": 8}, budget=64)
    assert sarathi == _batches("vllm", None, budget=8)
    assert sarathi != _batches("vllm", None, budget=64)  # the budget is what differs


def test_sarathi_rejects_bad_option() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        make_engine("sarathi", 64, options={"chunk": 8})


def test_priority_preempts_lower_priority_for_urgent_arrival() -> None:
    engine, executor, clock = make_engine("priority", num_device_blocks=4)
    low = make_request("low", 12, 20, priority=5)
    engine.add_request(low)
    engine.step()
    urgent = make_request("urgent", 8, 2, arrival=0.01, priority=0)
    engine.add_request(urgent)
    out = engine.step()
    assert [r.request_id for r in out.batch.requests] == ["urgent"]
    assert low.timeline.num_recomputes == 1
    run_to_completion(engine, clock)
    assert urgent.timeline.finish_time is not None and low.timeline.finish_time is not None
    assert urgent.timeline.finish_time < low.timeline.finish_time


def test_edf_serves_earliest_deadline_first() -> None:
    engine, executor, clock = make_engine("edf", num_device_blocks=64, max_num_seqs=1)
    engine.add_request(make_request("late", 4, 2, slo=SLO(deadline=100.0)))
    engine.add_request(make_request("none", 4, 2))
    engine.add_request(make_request("soon", 4, 2, slo=SLO(deadline=1.0)))
    run_to_completion(engine, clock)
    order = [b.requests[0].request_id for b in executor.batches if b.num_new_tokens[0] == 4]
    assert order == ["soon", "late", "none"]


def test_sjf_admits_shortest_prompt_first() -> None:
    engine, executor, clock = make_engine("sjf", num_device_blocks=64, max_num_seqs=1)
    for rid, n in (("long", 12), ("short", 4), ("mid", 8)):
        engine.add_request(make_request(rid, n, 1))
    run_to_completion(engine, clock)
    assert [b.requests[0].request_id for b in executor.batches] == ["short", "mid", "long"]


def test_registry_lists_baselines_and_refuses_unknown() -> None:
    assert {"vllm", "sarathi", "priority", "edf", "sjf"} <= set(policy_names())
    with pytest.raises(ValueError, match="unknown policy"):
        make_engine("nope", 8)
