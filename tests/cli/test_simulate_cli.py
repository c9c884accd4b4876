"""`andante simulate`: every request accounted for, limits from the model, typed options."""

from __future__ import annotations

import json

import pytest

from andante.cli.main import build_parser, main
from andante.cli.simulate import cluster_from_args
from andante.engine.config import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec
from andante.workload.formats import parse_trace_columns
from andante.workload.traces import load_trace


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
    assert "the context is 8192 tokens (--max-model-len 8192)" in run["first_rejections"][0]


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


# ---- issue 30 item 8: rows and options ------------------------------------------------


def test_zero_token_rows_are_counted_and_reported(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "t.csv"  # type: ignore[operator]
    path.write_text("Timestamp,Request tokens,Response tokens\n0,10,0\n1,0,3\n2,30,4\n")
    assert main(["simulate", "--no-progress", "--workload", f"trace:{path}"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "3 replayed (2 rows with 0 tokens run as 1 token)" in header
    assert main(["simulate", "--no-progress", "--json", "--workload", f"trace:{path}"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["num_zero_token_rows"] == 2


def test_trace_columns_keep_a_mooncake_files_hash_ids(
    tmp_path: pytest.TempPathFactory,
) -> None:
    path = tmp_path / "m.jsonl"  # type: ignore[operator]
    rows = [{"ts": i * 100, "in": 1024, "out": 4, "hash_ids": [1, 2 + i]} for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    mapped = load_trace(path, columns=parse_trace_columns("time=ts,prompt=in,output=out,unit=ms"))
    assert mapped.prefix_ids == ((1, 2), (1, 3), (1, 4)) and mapped.prefix_span == 512
    none = load_trace(path, columns=parse_trace_columns("time=ts,prompt=in,output=out,ids=none"))
    assert none.prefix_ids is None
    with pytest.raises(ValueError, match="span"):
        parse_trace_columns("time=ts,prompt=in,output=out,span=0")


def test_a_refusal_names_max_model_len_when_it_set_the_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--no-progress", "--num-requests", "3", "--lengths", "fixed:3000:4",
            "--max-model-len", "2048"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the context is 2048 tokens (--max-model-len 2048)" in out
    assert "the model's context" not in out


def test_block_size_must_be_one_vllm_has(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--block-size", "7", "--num-requests", "1"])
    assert "vLLM's block sizes" in capsys.readouterr().err


def test_compare_of_one_policy_twice_runs_it_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--no-progress", "--json", "--num-requests", "3",
                 "--compare", "vllm,vllm"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 1
    assert "vllm more than once: each runs once" in captured.err
