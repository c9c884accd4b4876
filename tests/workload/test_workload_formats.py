"""Trace formats: the common public traces' columns by name, JSONL, explicit mappings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from andante.cli.main import build_parser
from andante.cli.workload_args import workload_from_args
from andante.workload import build_workload, lengths, load_trace, parse_trace_columns


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_azure_2023_and_2024(tmp_path: Path) -> None:
    a23 = _write(tmp_path / "a23.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    a24 = _write(tmp_path / "a24.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.008000+00:00,4808,10\n"
                 "2024-05-10 00:00:01.508000+00:00,3180,8\n")
    t23, t24 = load_trace(a23), load_trace(a24)
    assert (t23.format, t23.num_rows) == ("azure", 2)
    assert t23.arrival_times[1] == pytest.approx(4.995169 - 0.68059)
    np.testing.assert_allclose(t24.arrival_times, [0.0, 1.5])
    assert t24.prompt_lens.tolist() == [4808, 3180]


def test_burstgpt_with_extra_columns_and_failed_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "burst.csv",
                  "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                  "5,ChatGPT,472,18,490,Conversation log\n"
                  "45,GPT-4,1087,0,1087,API log\n")
    trace = load_trace(path)
    assert trace.format == "burstgpt"
    assert trace.arrival_times.tolist() == [0.0, 40.0]
    assert trace.output_lens.tolist() == [18, 1]  # a failed request still produces a token


def test_mooncake_jsonl_in_milliseconds(tmp_path: Path) -> None:
    rows = [{"timestamp": 27482, "input_length": 6955, "output_length": 52,
             "hash_ids": [46, 47, 48]},
            {"timestamp": 0, "input_length": 6472, "output_length": 26, "hash_ids": [46]}]
    path = _write(tmp_path / "mooncake.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(path)
    assert trace.format == "mooncake"
    assert trace.arrival_times.tolist() == [0.0, 27.482]  # sorted, milliseconds -> seconds
    assert trace.prompt_lens.tolist() == [6472, 6955]


def test_vidur_and_splitwise_arrived_at(tmp_path: Path) -> None:
    path = _write(tmp_path / "splitwise_conv.csv",
                  "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,1020,120\n0.25,300,9\n")
    trace = load_trace(path)
    assert trace.format == "vidur" and trace.arrival_times.tolist() == [0.0, 0.25]


def test_explicit_mapping_with_unit(tmp_path: Path) -> None:
    path = _write(tmp_path / "mine.csv", "t_us,in,out\n2000000,10,3\n500000,20,4\n")
    with pytest.raises(ValueError, match="match no known trace format.*--trace-columns"):
        load_trace(path)
    columns = parse_trace_columns("time=t_us,prompt=in,output=out,unit=us")
    trace = load_trace(path, columns=columns)
    assert trace.arrival_times.tolist() == [0.0, 1.5]
    prompts, _ = lengths.from_trace(path, 50, np.random.default_rng(0), columns=columns)
    assert set(prompts.tolist()) == {10, 20}


@pytest.mark.parametrize(("text", "message"), [
    ("time=a,prompt=b", "missing output"),
    ("time=a,prompt=b,output=c,unit=h", "unit 'h'"),
    ("time=a,prompt=b,output=c,size=3", "bad item 'size=3'"),
])
def test_bad_mapping_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_trace_columns(text)


def test_bad_jsonl_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.jsonl", '{"timestamp": 0, "input_length": 1, '
                  '"output_length": 1}\n{"timestamp": 1, "input_length": 2}\n')
    with pytest.raises(ValueError, match="record 2 has no 'output_length'"):
        load_trace(path)


def test_cli_replays_the_whole_trace_with_its_own_lengths(tmp_path: Path) -> None:
    body = "".join(f"{i * 0.01},{100 + i % 7},{5 + i % 3}\n" for i in range(2500))
    path = _write(tmp_path / "long.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n" + body)
    args = build_parser().parse_args(["simulate", "--workload", f"trace:{path}"])
    specs = build_workload(workload_from_args(args))
    assert len(specs) == 2500
    assert [s.prompt_len for s in specs[:8]] == [100, 101, 102, 103, 104, 105, 106, 100]
    synthetic = build_parser().parse_args(["simulate", "--lengths", "fixed:8:8"])
    assert workload_from_args(synthetic).num_requests == 2000
