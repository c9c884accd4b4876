"""`andante serve` as a separate process: port 0, one request, stopped by its PID."""

from __future__ import annotations

import httpx
import pytest

from andante.cli.main import build_parser, main
from andante.cli.serve import options_from_args
from andante.server.config import TOY_MODEL
from tests.server.helpers import toy_serve_process


def test_serve_process_answers_and_stops() -> None:
    with toy_serve_process() as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3},
                       timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "The"


def test_options_from_the_command_line() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "toy", "--policy", "edf", "--policy-option", "x=1",
         "--max-queued", "7", "--max-num-seqs", "3", "--num-kv-blocks", "99"])
    options = options_from_args(args)
    assert options.model == TOY_MODEL and options.host == "127.0.0.1"
    assert (options.policy, dict(options.policy_options), options.max_queued) == ("edf",
                                                                                   {"x": 1}, 7)
    assert (options.engine.max_num_seqs, options.engine.num_kv_blocks) == (3, 99)


def test_several_named_models_from_the_command_line() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "a=toy", "--model", "b=", "--host-memory-gib", "0.5"])
    options = options_from_args(args)
    assert options.models == (("a", TOY_MODEL), ("b", None))
    assert options.host_memory_gib == 0.5


def test_serve_refuses_mixed_models_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "a=toy", "--model", "toy"]) == 2
    assert "NAME=" in capsys.readouterr().err
