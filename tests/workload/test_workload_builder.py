from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from andante.core.request import SyntheticTokens
from andante.workload import (
    TRACES_ENV_VAR,
    LengthSpec,
    RequestSpec,
    SLOConfig,
    WorkloadConfig,
    build_workload,
    parse_kind,
    parse_lengths,
    resolve_traces_dir,
    to_request,
    to_requests,
)


def _config(traces_dir: Path, **changes: object) -> WorkloadConfig:
    return WorkloadConfig(traces_dir=str(traces_dir), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["poisson", "gamma", "burst", "azure-code"])
def test_same_config_same_workload(kind: str, traces_dir: Path) -> None:
    config = _config(traces_dir, kind=kind, rate=4.0, cv=3.0, num_requests=300)
    first, second = build_workload(config), build_workload(config)
    assert first == second and len(first) == 300
    other = build_workload(
        _config(traces_dir, kind=kind, rate=4.0, cv=3.0, num_requests=300, seed=1)
    )
    assert [s.prompt_len for s in first] != [s.prompt_len for s in other]
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(first, first[1:], strict=False))


def test_lengths_do_not_move_arrivals(traces_dir: Path) -> None:
    fixed = build_workload(_config(traces_dir, lengths="fixed:128:64", num_requests=200))
    shared = build_workload(_config(traces_dir, lengths="sharegpt", num_requests=200))
    assert [s.arrival_time for s in fixed] == [s.arrival_time for s in shared]
    assert {(s.prompt_len, s.output_len) for s in fixed} == {(128, 64)}


def test_synthetic_rate_scale_and_duration() -> None:
    config = WorkloadConfig(
        rate=2.0, rate_scale=5.0, num_requests=None, duration=200.0, lengths="uniform:1:4:1:4"
    )
    specs = build_workload(config)
    assert specs[-1].arrival_time <= 200.0
    assert len(specs) == pytest.approx(2000, rel=0.1)


def test_trace_replay(traces_dir: Path, tmp_path: Path) -> None:
    config = _config(
        traces_dir,
        kind="azure-conv",
        lengths="trace",
        num_requests=None,
        duration=120.0,
        rate_scale=2.0,
    )
    specs = build_workload(config)
    assert specs[0].arrival_time == 0.0 and specs[-1].arrival_time <= 120.0
    path = tmp_path / "mini.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0000000,7000,3\n2023-11-16 18:00:01.2500000,5,9\n"
    )
    mini = build_workload(WorkloadConfig(kind=f"trace:{path}", lengths="trace"))
    assert [(s.arrival_time, s.prompt_len, s.output_len) for s in mini] == [
        (0.0, 7000, 3),
        (1.25, 5, 9),
    ]
    assert [s.slo.ttft for s in mini] == [1.4, 1.0]


def test_slo_model_and_priority_pass_through() -> None:
    config = WorkloadConfig(
        num_requests=20,
        lengths="fixed:10:5",
        model="m",
        priority=3,
        slo=SLOConfig(tds=4.8, tbt=0.2),
    )
    specs = build_workload(config)
    assert {(s.model, s.priority, s.slo.tds, s.slo.tbt) for s in specs} == {("m", 3, 4.8, 0.2)}


def test_parse_lengths() -> None:
    assert parse_lengths("fixed:128:64") == LengthSpec("fixed", (128, 64))
    assert parse_lengths("uniform:1:2:3:4") == LengthSpec("uniform", (1, 2, 3, 4))
    assert parse_lengths("sharegpt") == LengthSpec("sharegpt")
    assert parse_lengths("sharegpt:/x/y.csv") == LengthSpec("sharegpt", path="/x/y.csv")
    assert parse_lengths("trace") == LengthSpec("trace")
    assert parse_lengths("azure-code") == LengthSpec("azure-code")
    for bad, message in [
        ("fixed:128", "expected 2 numbers"),
        ("fixed:a:b", "whole numbers"),
        ("fixed:0:5", ">= 1"),
        ("uniform:5:1:1:2", "a <= b"),
        ("zipf", "unknown lengths 'zipf'"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_lengths(bad)


def test_parse_kind() -> None:
    assert parse_kind("burst") == ("burst", None)
    assert parse_kind("trace:/a/b.csv") == ("trace", "/a/b.csv")
    with pytest.raises(ValueError, match="unknown workload kind 'trace:'"):
        parse_kind("trace:")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "uniform"}, "unknown workload kind"),
        ({"rate": 0.0}, "rate must be"),
        ({"num_requests": None}, "needs num_requests or duration"),
        ({"lengths": "trace"}, "lengths 'trace' reuses"),
        ({"kind": "burst", "burst_intensity": 4.0, "burst_share": 0.5}, "burst_intensity ×"),
        ({"seed": -1}, "seed"),
        ({"max_context": 1}, "max_context"),
    ],
)
def test_invalid_configs(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**changes)  # type: ignore[arg-type]


def test_missing_trace_files_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="AzureLLMInferenceTrace_conv.csv: no such file"):
        build_workload(WorkloadConfig(kind="azure-conv", traces_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="sharegpt_8k.*: no such file"):
        build_workload(WorkloadConfig(traces_dir=str(tmp_path)))


def test_resolve_traces_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_traces_dir(tmp_path, {TRACES_ENV_VAR: "/elsewhere"}) == tmp_path
    assert resolve_traces_dir(None, {TRACES_ENV_VAR: "/elsewhere"}) == Path("/elsewhere")
    monkeypatch.chdir(tmp_path)
    assert resolve_traces_dir(None, {}) == tmp_path / ".." / "shared" / "traces"


def test_to_request() -> None:
    spec = RequestSpec(arrival_time=1.5, prompt_len=300, output_len=20, priority=2, model="m")
    request = to_request(spec, "r1", time_offset=10.0)
    assert isinstance(request.prompt_token_ids, SyntheticTokens)
    assert request.num_prompt_tokens == 300 and request.arrival_time == 11.5
    assert request.sampling.max_tokens == 20 and request.sampling.ignore_eos
    assert (request.priority, request.model, request.slo) == (2, "m", spec.slo)
    assert [r.request_id for r in to_requests([spec, spec])] == ["req-0", "req-1"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((-1.0, 10, 10), "arrival_time"),
        ((float("nan"), 10, 10), "arrival_time"),
        ((0.0, 0, 10), "prompt_len"),
        ((0.0, 10, 0), "output_len"),
    ],
)
def test_request_spec_validation(fields: tuple[float, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RequestSpec(*fields)


def test_workload_mean_rate_matches_config() -> None:
    specs = build_workload(
        WorkloadConfig(
            kind="burst",
            rate=5.0,
            num_requests=None,
            duration=2400.0,
            cycle_length=1200.0,
            lengths="fixed:8:8",
        )
    )
    times = np.array([s.arrival_time for s in specs])
    assert len(times) / 2400.0 == pytest.approx(5.0, rel=0.05)
