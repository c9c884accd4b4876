"""`andante batch FILE`: offline batches through the server's batch path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andante.cli.main import main
from andante.server.toy import TOY_TEXT
from tests.server.batch_helpers import batch_lines, jsonl

TOY = ["--model", "toy", "--toy-step-ms", "1", "--no-progress"]


def test_runs_a_file_and_writes_every_line_in_order(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = batch_lines(8, "/v1/chat/completions", max_tokens=5)
    lines[2]["body"]["temperature"] = 9  # invalid: its line is an error response
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(lines))
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(source), "-o", str(out), "--state-dir", str(tmp_path / "s"),
                 *TOY]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [w["custom_id"] for w in written] == [f"req-{i}" for i in range(8)]
    assert written[0]["response"]["body"]["choices"][0]["message"]["content"] == TOY_TEXT[:5]
    assert written[2]["response"]["status_code"] == 400
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["status"], summary["completed"], summary["failed"]) == ("completed", 7, 1)


def test_bad_files_exit_2_with_a_message(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["batch", str(tmp_path / "missing.jsonl"), *TOY]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["batch", str(bad), *TOY]) == 2
    assert "line 1: not valid JSON" in capsys.readouterr().err
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(jsonl(batch_lines(1) + batch_lines(1, "/v1/chat/completions", prefix="c")))
    assert main(["batch", str(mixed), *TOY]) == 2
    assert "one endpoint" in capsys.readouterr().err


def test_serve_with_an_unusable_queue_exits_2(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    serve = ["serve", "--model", "toy", "--port", "0", "--log-level", "error"]
    assert main([*serve, "--state-dir", str(not_a_dir / "state")]) == 2
    assert "cannot open the batch queue" in capsys.readouterr().err
    assert main([*serve, "--queue", "redis://127.0.0.1:1"]) == 2
    assert "cannot reach the Redis queue" in capsys.readouterr().err
    assert main([*serve, "--queue", "nats://x"]) == 2
    assert "queue must be 'sqlite' or redis://" in capsys.readouterr().err
