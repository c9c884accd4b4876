"""`--prefix-sharing` and `--no-prefix-caching` on `andante simulate`, and the flag on
`serve` and `generate`."""

from __future__ import annotations

import json

import pytest

from andante.cli.main import build_parser, main

ARGS = ("--num-requests", "20", "--rate", "0.5", "--lengths", "fixed:50:10",
        "--prefix-sharing", "system:320")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["simulate", "--no-progress", "--json", *ARGS, *argv]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[0])


def test_simulate_reports_the_hit_rate_and_can_switch_the_cache_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    on = _run(capsys)
    assert on["saved_prefill_tokens"] == 19 * 320  # every request but the first
    assert on["prefix_cache_hit_rate"] == pytest.approx(19 * 320 / (20 * 370))
    off = _run(capsys, "--no-prefix-caching")
    assert off["saved_prefill_tokens"] == 0 and off["prefix_cache_hit_rate"] is None


def test_a_bad_sharing_spec_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--no-progress", "--prefix-sharing", "chat:3"]) == 2
    assert "prefix sharing" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["serve"], ["generate", "hello"]])
def test_the_flag_is_shared(command: list[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(command).enable_prefix_caching
    assert not parser.parse_args([*command, "--no-prefix-caching"]).enable_prefix_caching
