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


def test_a_killed_run_resumes_its_batch(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #26 item 9: the rerun finds the unfinished batch by the input's hash."""
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(batch_lines(16, max_tokens=10)))
    state = tmp_path / "s"
    args = ["batch", str(source), "-o", str(tmp_path / "out.jsonl"), "--state-dir",
            str(state), "--model", "toy", "--toy-step-ms", "20", "--batch-max-in-flight",
            "2", "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "andante.cli.main", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db_path = state / "andante-queue.sqlite3"

    def done() -> int:
        try:
            with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
                return int(db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0])
        except sqlite3.Error:
            return 0

    deadline = time.monotonic() + 60
    while done() < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    with sqlite3.connect(db_path) as db:
        (first,) = db.execute("SELECT id FROM batches").fetchone()
        already = int(db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0])
    assert 2 <= already < 16
    assert main(args[:-1]) == 0  # the same run again (a bar or not: same input)
    captured = capsys.readouterr()
    assert f"resuming {first}" in captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["batch"] == first and summary["completed"] == 16
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 1


def test_a_second_server_on_one_state_dir_refuses_naming_the_holder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #26 item 8."""
    import os
    import subprocess
    import sys

    from andante.runtime.durable.sqlite import SQLiteStore

    state = tmp_path / "s"
    state.mkdir()
    holder = SQLiteStore(state / "andante-queue.sqlite3")
    try:
        second = subprocess.run([sys.executable, "-m", "andante.cli.main", "serve", "--model",
                                 "toy", "--port", "0", "--log-level", "error", "--state-dir",
                                 str(state)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert "in use by process" in second.stderr and str(os.getpid()) in second.stderr
    finally:
        holder.close()
    again = SQLiteStore(state / "andante-queue.sqlite3")  # released with the holder
    again.close()
