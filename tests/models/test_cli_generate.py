"""`andante generate` on a tiny checkpoint: text out, through the real scheduler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.cli.main import main


def test_generate_prints_one_json_line_per_prompt(tiny_llama: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "w7 w8 w9", "w10", "--model", str(tiny_llama), "--dtype",
                 "float32", "--max-tokens", "5", "--ignore-eos", "--json",
                 "--kv-cache-gib", "0.01"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [d["prompt"] for d in lines] == ["w7 w8 w9", "w10"]
    assert all(d["num_output_tokens"] == 5 and d["finish_reason"] == "length" for d in lines)
    assert all(d["ttft_s"] is not None and d["ttft_s"] >= 0 for d in lines)


def test_generate_reports_a_bad_model_path(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--model", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
