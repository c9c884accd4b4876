"""Progress of `andante bench` / `simulate` and the heartbeat of `andante experiment`."""

from __future__ import annotations

import io
import time

import pytest

from andante.cli import progress as progress_mod
from andante.cli.progress import Heartbeat, Progress


def test_off_a_terminal_progress_prints_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_mod, "LINE_INTERVAL_S", 0.0)
    out = io.StringIO()
    bar = Progress(3, "bench", stream=out)
    for _ in range(3):
        bar.advance()
    bar.close()
    assert out.getvalue().splitlines()[-1].startswith("bench: 3/3 done")
    assert "\r" not in out.getvalue()


def test_progress_can_be_silenced() -> None:
    out = io.StringIO()
    bar = Progress(2, "bench", enabled=False, stream=out)
    bar.advance(2)
    bar.close()
    assert out.getvalue() == ""


def test_heartbeat_reports_while_running() -> None:
    out = io.StringIO()
    with Heartbeat("experiment x", interval=0.02, stream=out):
        time.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("experiment x: still running (") for line in lines)


def test_heartbeat_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval must be > 0, got 0"):
        Heartbeat("x", interval=0)
