"""Workloads whose prompts share prefixes: system prompt, conversations, trace ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.workload import RequestSpec, WorkloadConfig, build_workload
from andante.workload.prefix import (
    as_conversations,
    expected_hit_tokens,
    parse_prefix_sharing,
    with_system_prompt,
)


def _specs(prompts: list[int], output: int = 10) -> list[RequestSpec]:
    return [RequestSpec(float(i), p, output) for i, p in enumerate(prompts)]


def test_system_prompt_shares_its_full_spans() -> None:
    specs = with_system_prompt(_specs([5, 40]), 100, span=16)
    assert [s.prompt_len for s in specs] == [105, 140]
    a, b = (s.prefix for s in specs)
    assert a is not None and b is not None
    assert a.ids[:6] == b.ids[:6]  # 6 full spans of 16 in 100 tokens
    assert a.ids[6] != b.ids[6]  # tokens 96-111 mix the system prompt and own text
    assert (a.num_tokens, len(a.ids)) == (105, 7)
    assert expected_hit_tokens(specs, 16) == [0, 96]


def test_conversations_grow_by_each_answer_and_new_text() -> None:
    specs = as_conversations(_specs([20, 30, 15, 25, 10]), 2, span=16)
    assert [s.prompt_len for s in specs] == [20, 30, 20 + 10 + 15, 30 + 10 + 25, 45 + 10 + 10]
    first, third = specs[0].prefix, specs[2].prefix
    assert first is not None and third is not None
    assert third.ids[:1] == first.ids[:1]  # 30 tokens of turn 1: one full span kept
    assert third.ids[1] != first.ids[1]
    # turn 2 of conversation 0: turn 1 computed 29 tokens, one full block
    assert expected_hit_tokens(specs, 16)[:3] == [0, 0, 16]


def test_a_conversation_that_would_overflow_starts_afresh() -> None:
    specs = as_conversations(_specs([60, 60, 60]), 1, max_context=150)
    assert [s.prompt_len for s in specs] == [60, 130, 60]
    assert expected_hit_tokens(specs, 16)[2] == 0


@pytest.mark.parametrize("bad", ["system", "system:x", "chat:3", "conversation:0",
                                 "system:1:2:3"])
def test_bad_sharing_specs_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_prefix_sharing(bad)
    with pytest.raises(ValueError):
        WorkloadConfig(prefix_sharing=bad)


def test_builder_applies_sharing() -> None:
    specs = build_workload(WorkloadConfig(num_requests=5, lengths="fixed:50:5",
                                          prefix_sharing="system:64:32"))
    assert all(s.prompt_len == 114 and s.prefix is not None for s in specs)
    assert len({s.prefix.ids[:2] for s in specs if s.prefix}) == 1


def test_mooncake_hash_ids_become_content_ids(tmp_path: Path) -> None:
    rows = [{"timestamp": 10, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
            {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 3]}]
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = build_workload(WorkloadConfig(kind=f"trace:{path}", num_requests=None,
                                          lengths="trace"))
    first, second = (s.prefix for s in specs)
    assert first is not None and second is not None
    assert (first.ids, first.span_tokens, first.num_tokens) == ((7, 3), 512, 600)
    assert (second.ids, second.num_tokens) == ((7, 8, 9), 1100)
    assert expected_hit_tokens(specs, 16) == [0, 512]  # the span of id 7, in 32 blocks


def test_hash_ids_must_be_integers(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1,
                                "hash_ids": ["a"]}) + "\n")
    with pytest.raises(ValueError, match="block ids"):
        build_workload(WorkloadConfig(kind=f"trace:{path}", num_requests=None,
                                      lengths="trace"))
