"""QLM workload mixes: model popularity, SLO classes, mega prompts."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from andante.workload.mixes import (
    BATCH_DEADLINE_S,
    LATENCY_DEADLINE_S,
    add_mega_prompts,
    assign_deadlines,
    assign_models,
    head_tail_weights,
    parse_model_mix,
    slo_class,
)
from andante.workload.spec import RequestSpec

SPECS = [RequestSpec(i * 0.1, 100, 50) for i in range(4000)]


def test_head_tail_weights_put_the_tail_share_on_tail_models() -> None:
    w = head_tail_weights(["a", "b", "c", "d"], 1, 0.6)
    assert w == pytest.approx({"a": 0.4, "b": 0.2, "c": 0.2, "d": 0.2})
    with pytest.raises(ValueError, match="num_head must be in"):
        head_tail_weights(["a"], 2, 0.5)
    with pytest.raises(ValueError, match="tail_share must be in"):
        head_tail_weights(["a", "b"], 1, 1.5)


def test_assign_models_follows_the_weights() -> None:
    counts = Counter(s.model for s in assign_models(SPECS, {"a": 0.75, "b": 0.25}, seed=3))
    assert counts["a"] / len(SPECS) == pytest.approx(0.75, abs=0.03)
    assert set(counts) == {"a", "b"}


def test_parse_model_mix_normalises_and_refuses_bad_entries() -> None:
    assert parse_model_mix("a:3,b") == pytest.approx({"a": 0.75, "b": 0.25})
    for bad in ("a:x", "a:-1", ""):
        with pytest.raises(ValueError):
            parse_model_mix(bad)


def test_deadlines_and_mega_prompts() -> None:
    specs = assign_deadlines(SPECS, 0.3, seed=1)
    latency = sum(s.slo.deadline == LATENCY_DEADLINE_S for s in specs)
    assert latency / len(specs) == pytest.approx(0.3, abs=0.03)
    assert {s.slo.deadline for s in specs} == {LATENCY_DEADLINE_S, BATCH_DEADLINE_S}
    assert slo_class(specs[0].slo) in ("20s", "300s") and slo_class(SPECS[0].slo) == "none"
    mega = add_mega_prompts(specs, 0.05, seed=1, prompt_len=3000, output_len=900)
    num_mega = sum(s.prompt_len == 3000 for s in mega)
    assert 0 < num_mega < 0.1 * len(mega)
    assert all(s.output_len == 900 for s in mega if s.prompt_len == 3000)


def test_a_model_mix_in_the_workload_config_draws_each_requests_model() -> None:
    from andante.workload import WorkloadConfig, build_workload
    from andante.workload.mixes import assign_models, format_model_mix

    mix = {"a": 0.7, "b": 0.2, "c": 0.1}
    base = WorkloadConfig(kind="poisson", rate=5.0, num_requests=400, lengths="fixed:8:4",
                          seed=3)
    mixed = build_workload(dataclasses.replace(base, model_mix=format_model_mix(mix)))
    plain = build_workload(base)
    assert [s.arrival_time for s in mixed] == [s.arrival_time for s in plain]
    assert mixed == assign_models(plain, mix, 3)  # the same draw as assigning afterwards
    counts = {m: sum(s.model == m for s in mixed) for m in mix}
    assert counts["a"] > counts["b"] > counts["c"] > 0
    assert parse_model_mix(format_model_mix(mix)) == pytest.approx(mix)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"model_mix": "a:0"}, "weight > 0"), ({"model_mix": ""}, "empty"),
    ({"model_mix": "a:1", "model": "b"}, "not both"),
])
def test_bad_model_mix_in_the_workload_config(kwargs: dict, match: str) -> None:
    from andante.workload import WorkloadConfig

    with pytest.raises(ValueError, match=match):
        WorkloadConfig(**kwargs)
