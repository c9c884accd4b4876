"""`andante simulate`: every request accounted for, limits from the model, typed options."""

from __future__ import annotations

import json

import pytest

from andante.cli.main import build_parser, main
from andante.cli.simulate import cluster_from_args
from andante.engine.config import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec


def _json_runs(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    assert main(["simulate", "--no-progress", "--json", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_long_prompts_are_rejected_with_a_reason_not_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = _json_runs(capsys, "--lengths", "uniform:4000:20000:100:500", "--num-requests", "30",
                      "--max-model-len", "8192", "--rate", "50")
    (run,) = runs
    assert run["num_requests"] == 30
    assert run["num_rejected"] > 0 and run["num_finished"] + run["num_rejected"] == 30
    assert "the model's context is 8192 tokens" in run["first_rejections"][0]


def test_rejection_reasons_are_printed_with_max_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--no-progress", "--lengths", "uniform:7000:9000:10:20",
            "--num-requests", "10", "--max-model-len", "8192", "--max-context", "20000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "rejected; the first:" in out and "prompt has" in out


def test_output_beyond_the_limit_counts_as_truncated() -> None:
    spec = ClusterSpec(scheduler=SchedulerConfig(max_model_len=1000, max_num_batched_tokens=1000))
    workload = [RequestSpec(0.0, 900, 200), RequestSpec(0.1, 100, 50)]
    summary = simulate(spec, workload).summary
    assert (summary.num_finished, summary.num_truncated, summary.num_rejected) == (2, 1, 0)


def test_max_model_len_defaults_to_the_models_context_and_is_capped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["simulate", "--model", "llama-3.1-8b"])
    assert cluster_from_args(args, "vllm").scheduler.max_model_len == 131072
    assert main(["simulate", "--max-model-len", "1000000", "--num-requests", "2"]) == 2
    assert "exceeds the context of llama-3.1-8b" in capsys.readouterr().err


def test_only_whole_prompt_policies_get_the_budget_raised() -> None:
    args = build_parser().parse_args(["simulate", "--max-num-batched-tokens", "2048"])
    assert cluster_from_args(args, "vllm").scheduler.max_num_batched_tokens == 2048
    assert cluster_from_args(args, "vllm-v0").scheduler.max_num_batched_tokens == 131072


def test_whole_prompt_policy_with_a_small_budget_is_refused_not_stuck() -> None:
    config = SchedulerConfig(max_model_len=4096, max_num_batched_tokens=1024)
    with pytest.raises(ValueError, match="prefills whole prompts"):
        simulate(ClusterSpec(policy="vllm-v0", scheduler=config), [RequestSpec(0.0, 3000, 4)])
    run = simulate(ClusterSpec(policy="vllm", scheduler=config), [RequestSpec(0.0, 3000, 4)])
    assert run.summary.num_finished == 1


def test_trace_header_counts_rows_and_shows_no_rate(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "t.csv"  # type: ignore[operator]
    path.write_text("Timestamp,Request tokens,Response tokens\n0,10,2\n1,20,3\n2,30,4\n")
    assert main(["simulate", "--no-progress", "--workload", f"trace:{path}"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "3 rows read, 3 replayed" in header and "burstgpt" in header
    assert "rate" not in header
