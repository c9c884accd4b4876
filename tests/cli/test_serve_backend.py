"""`andante serve --backend auto`: an engine process for one real model, threads for
the toy model, several models and KunServe; an explicit backend is kept; the process
backend refuses several models with a clear error."""

from __future__ import annotations

import pytest

from andante.cli.main import build_parser, main
from andante.cli.serve import options_from_args, resolve_backend


def test_auto_picks_an_engine_process_for_one_real_model() -> None:
    assert resolve_backend("auto", None, (), "round-robin") == "process"
    assert resolve_backend("auto", "/models/x.gguf", (), "least-loaded") == "process"


def test_auto_keeps_threads_where_instances_share_the_process() -> None:
    assert resolve_backend("auto", "toy", (), "round-robin") == "inprocess"
    assert resolve_backend("auto", None, (("a", None), ("b", "toy")), "qlm") == "inprocess"
    assert resolve_backend("auto", None, (), "kunserve") == "inprocess"


@pytest.mark.parametrize("backend", ["inprocess", "process", "ray"])
def test_an_explicit_backend_is_kept(backend: str) -> None:
    args = build_parser().parse_args(["serve", "--model", "toy", "--backend", backend])
    assert options_from_args(args).backend == backend


def test_the_default_on_the_command_line() -> None:
    args = build_parser().parse_args(["serve", "--model", "toy"])
    assert options_from_args(args).backend == "inprocess"


def test_process_backend_with_several_models_exits_2(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert main(["serve", "--model", "a=toy", "--model", "b=toy", "--backend", "process"]) == 2
    assert "backend 'process' serves one model" in capsys.readouterr().err
