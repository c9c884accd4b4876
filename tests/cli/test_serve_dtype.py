"""`andante serve --dtype auto`: bfloat16 where the CPU has oneDNN bf16 GEMMs, else
float32; the toy model always float32; an explicit dtype is kept."""

from __future__ import annotations

import argparse

import pytest

from andante.cli import serve
from andante.exec import torch_layers


def _args(dtype: str, model: list[str] | None) -> argparse.Namespace:
    return argparse.Namespace(dtype=dtype, model=model)


@pytest.mark.parametrize("has_bf16, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_follows_the_cpu(monkeypatch: pytest.MonkeyPatch, has_bf16: bool,
                              expected: str) -> None:
    monkeypatch.setattr(torch_layers, "packed_gemm_supported", lambda dtype: has_bf16)
    assert serve._dtype(_args("auto", None)) == expected
    assert serve._dtype(_args("auto", ["a=/some/model.gguf", "b=toy"])) == expected


def test_toy_and_explicit_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_layers, "packed_gemm_supported", lambda dtype: True)
    assert serve._dtype(_args("auto", ["toy"])) == "float32"
    assert serve._dtype(_args("auto", ["a=toy", "b=toy"])) == "float32"
    assert serve._dtype(_args("float32", None)) == "float32"
    assert serve._dtype(_args("bfloat16", ["toy"])) == "bfloat16"
