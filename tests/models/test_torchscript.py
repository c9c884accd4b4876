"""`andante.models.torchscript.script`: scripted where it can be, eager otherwise."""

import logging

import pytest
import torch

from andante.models import torchscript
from andante.models.torchscript import script


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _unscriptable(x: torch.Tensor) -> torch.Tensor:
    return x * len({1, 2})  # TorchScript has no set literals


def test_scripts_a_function() -> None:
    scripted = script(_double)
    assert isinstance(scripted, torch.jit.ScriptFunction)
    x = torch.arange(4.0)
    assert torch.equal(scripted(x), x * 2)


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(torchscript.DISABLE_ENV, "1")
    assert script(_double) is _double


def test_falls_back_to_eager_when_scripting_fails(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=torchscript.__name__):
        fn = script(_unscriptable)
    assert fn is _unscriptable
    assert "_unscriptable" in caplog.text
    assert torch.equal(fn(torch.ones(2)), torch.full((2,), 2.0))
